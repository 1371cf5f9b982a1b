// Package signtest makes the inputs of signing tests: minimal ELF objects that the sign package
// takes for kernel modules (or, without .modinfo or not relocatable, refuses).
package signtest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
)

// FakeModule is a minimal ELF64 relocatable object with a .modinfo section and pad bytes of
// payload (a .text section), which the sign package takes for a kernel module.
func FakeModule(name string, pad int) []byte {
	return ELFObject(elf.ET_REL, name, pad, true)
}

// ELFObject writes an ELF64 little-endian object of the type with sections .modinfo (when
// modinfo), .text (pad bytes, a pattern from name) and .shstrtab.
func ELFObject(typ elf.Type, name string, pad int, modinfo bool) []byte {
	shstr := []byte("\x00.modinfo\x00.text\x00.shstrtab\x00")
	info := []byte("license=GPL\x00name=" + name + "\x00")
	text := make([]byte, pad)
	for i := range text {
		text[i] = name[i%len(name)] ^ byte(i>>8)
	}
	var body bytes.Buffer
	body.Write(make([]byte, 64))
	type sec struct {
		name uint32
		data []byte
		typ  elf.SectionType
	}
	secs := []sec{{name: 10, data: text, typ: elf.SHT_PROGBITS}, {name: 16, data: shstr, typ: elf.SHT_STRTAB}}
	if modinfo {
		secs = append([]sec{{name: 1, data: info, typ: elf.SHT_PROGBITS}}, secs...)
	}
	hdrs := []elf.Section64{{}}
	for _, s := range secs {
		hdrs = append(hdrs, elf.Section64{Name: s.name, Type: uint32(s.typ), Off: uint64(body.Len()), Size: uint64(len(s.data)), Addralign: 1}) //nolint:gosec // G115: offsets of a few KiB
		body.Write(s.data)
	}
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := body.Len()
	for _, h := range hdrs {
		_ = binary.Write(&body, binary.LittleEndian, h) // a bytes.Buffer does not fail
	}
	out := body.Bytes()
	hdr := elf.Header64{
		Type: uint16(typ), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Shoff: uint64(shoff), Ehsize: 64, Shentsize: 64, Shnum: uint16(len(hdrs)), Shstrndx: uint16(len(hdrs) - 1), //nolint:gosec // G115: a few sections
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS], hdr.Ident[elf.EI_DATA], hdr.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var h bytes.Buffer
	_ = binary.Write(&h, binary.LittleEndian, hdr)
	copy(out, h.Bytes())
	return out
}
