package sign

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/binary"
	"io"
	"log"
	"math/big"
	"testing"
	"time"
)

// keyPair is a test key with its certificate.
type keyPair struct {
	key  crypto.Signer
	cert *x509.Certificate
}

// testRSAKey is generated once: 2048-bit generation takes a while on the shared machine.
var testRSAKey = func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
}()

// newCert makes a certificate for key, self-signed when parent is nil.
func newCert(t testing.TB, key crypto.Signer, cn string, serial int64, parent *keyPair) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"kmm test"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		IsCA:                  parent == nil,
		BasicConstraintsValid: true,
	}
	issuer, signer := tmpl, key
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func rsaPair(t testing.TB) keyPair {
	return keyPair{key: testRSAKey, cert: newCert(t, testRSAKey, "kmm module signing (RSA)", 4242, nil)}
}

func ecdsaPair(t testing.TB, curve elliptic.Curve) keyPair {
	k, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{key: k, cert: newCert(t, k, "kmm module signing (ECDSA)", 77, nil)}
}

func (p keyPair) signer(t testing.TB, h crypto.Hash) *Signer {
	t.Helper()
	s, err := NewSigner(p.key, p.cert, Options{Hash: h})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeModule returns a minimal ELF64 relocatable object with a .modinfo section and pad bytes of
// payload (a .text section), which CheckModule takes for a kernel module.
func fakeModule(t testing.TB, name string, pad int) []byte {
	t.Helper()
	return elfObject(t, elf.ET_REL, name, pad, true)
}

// elfObject writes an ELF64 little-endian object of the type with sections .modinfo (when
// modinfo), .text (pad bytes, a pattern from name) and .shstrtab.
func elfObject(t testing.TB, typ elf.Type, name string, pad int, modinfo bool) []byte {
	t.Helper()
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
		hdrs = append(hdrs, elf.Section64{Name: s.name, Type: uint32(s.typ), Off: uint64(body.Len()), Size: uint64(len(s.data)), Addralign: 1})
		body.Write(s.data)
	}
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := body.Len()
	for _, h := range hdrs {
		if err := binary.Write(&body, binary.LittleEndian, h); err != nil {
			t.Fatal(err)
		}
	}
	out := body.Bytes()
	hdr := elf.Header64{
		Type: uint16(typ), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Shoff: uint64(shoff), Ehsize: 64, Shentsize: 64, Shnum: uint16(len(hdrs)), Shstrndx: uint16(len(hdrs) - 1),
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS], hdr.Ident[elf.EI_DATA], hdr.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	var h bytes.Buffer
	if err := binary.Write(&h, binary.LittleEndian, hdr); err != nil {
		t.Fatal(err)
	}
	copy(out, h.Bytes())
	return out
}

func nil2P256() elliptic.Curve { return elliptic.P256() }

// nopLogger silences the in-process registry.
func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }
