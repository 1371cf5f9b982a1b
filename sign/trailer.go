package sign

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Magic ends every signed module (the kernel's MODULE_SIG_STRING).
const Magic = "~Module signature appended~\n"

// InfoSize is the size of struct module_signature.
const InfoSize = 12

// IDTypePKCS7 is PKEY_ID_PKCS7, the only id_type the kernel accepts.
const IDTypePKCS7 = 2

// Info is struct module_signature, the trailer between the signature and Magic. For a PKCS#7
// signature every field but IDType and SigLen is zero.
type Info struct {
	Algo, Hash, IDType, SignerLen, KeyIDLen uint8
	Pad                                     [3]uint8
	// SigLen is the length of the signature, big-endian on disk.
	SigLen uint32
}

// Marshal encodes the trailer as the kernel reads it.
func (i Info) Marshal() []byte {
	b := make([]byte, InfoSize)
	b[0], b[1], b[2], b[3], b[4] = i.Algo, i.Hash, i.IDType, i.SignerLen, i.KeyIDLen
	copy(b[5:8], i.Pad[:])
	binary.BigEndian.PutUint32(b[8:], i.SigLen)
	return b
}

// parseInfo decodes a trailer of InfoSize bytes.
func parseInfo(b []byte) Info {
	i := Info{Algo: b[0], Hash: b[1], IDType: b[2], SignerLen: b[3], KeyIDLen: b[4], SigLen: binary.BigEndian.Uint32(b[8:])}
	copy(i.Pad[:], b[5:8])
	return i
}

// Append returns module followed by the PKCS#7 signature sig, its trailer and Magic.
func Append(module, sig []byte) []byte {
	out := make([]byte, 0, len(module)+len(sig)+InfoSize+len(Magic))
	out = append(out, module...)
	out = append(out, sig...)
	out = append(out, Info{IDType: IDTypePKCS7, SigLen: uint32(len(sig))}.Marshal()...) // #nosec G115 -- sig is a few KiB
	return append(out, Magic...)
}

// Split separates a module from its appended signature with the kernel's checks
// (mod_check_sig): it returns the module bytes, the PKCS#7 signature and true for a signed
// module, data itself and false for an unsigned one. A file that ends with Magic but whose trailer
// the kernel would refuse is a ClassMalformedSignature error.
func Split(data []byte) (module, sig []byte, signed bool, err error) {
	if !bytes.HasSuffix(data, []byte(Magic)) {
		return data, nil, false, nil
	}
	body := data[:len(data)-len(Magic)]
	if len(body) < InfoSize {
		return nil, nil, false, errorf(ClassMalformedSignature, "%d bytes before the signature magic, fewer than its %d-byte trailer", len(body), InfoSize)
	}
	info := parseInfo(body[len(body)-InfoSize:])
	if int64(info.SigLen) >= int64(len(body)-InfoSize) {
		return nil, nil, false, errorf(ClassMalformedSignature, "signature length %d does not fit the %d bytes before it", info.SigLen, len(body)-InfoSize)
	}
	if info.IDType != IDTypePKCS7 {
		return nil, nil, false, errorf(ClassMalformedSignature, "signature id_type %d, not PKCS#7 (%d)", info.IDType, IDTypePKCS7)
	}
	if info.Algo != 0 || info.Hash != 0 || info.SignerLen != 0 || info.KeyIDLen != 0 || info.Pad != [3]uint8{} {
		return nil, nil, false, errorf(ClassMalformedSignature, "PKCS#7 signature trailer with non-zero fields %+v", info)
	}
	end := len(body) - InfoSize
	start := end - int(info.SigLen)
	return data[:start], data[start:end], true, nil
}

// String describes the trailer.
func (i Info) String() string {
	return fmt.Sprintf("id_type %d, sig_len %d", i.IDType, i.SigLen)
}
