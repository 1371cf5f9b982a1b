package sign

import (
	"bytes"
	"crypto"
	"crypto/elliptic"
	"debug/elf"
	"encoding/binary"
	"testing"
)

// TestSignModuleVerifies signs modules with each key type and digest and checks every signature
// against the certificate with the tests' own reader.
func TestSignModuleVerifies(t *testing.T) {
	rsaKP := rsaPair(t)
	caKP := keyPair{key: rsaKP.key, cert: newCert(t, rsaKP.key, "kmm test CA", 1, nil)}
	leaf := ecdsaPair(t, elliptic.P256())
	// A certificate issued by a CA: the signer is named by the issuer (the CA), not the subject.
	leaf.cert = newCert(t, leaf.key, "kmm module signing (issued)", 99, &caKP)
	cases := []struct {
		name string
		kp   keyPair
		hash crypto.Hash
	}{
		{"rsa-sha256", rsaKP, crypto.SHA256},
		{"rsa-sha384", rsaKP, crypto.SHA384},
		{"rsa-sha512", rsaKP, crypto.SHA512},
		{"ecdsa-p256-sha256", ecdsaPair(t, elliptic.P256()), crypto.SHA256},
		{"ecdsa-p384-sha384", ecdsaPair(t, elliptic.P384()), crypto.SHA384},
		{"ecdsa-ca-issued", leaf, crypto.SHA256},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mod := fakeModule(t, c.name, 4096)
			signed, resigned, err := c.kp.signer(t, c.hash).SignModule(mod)
			if err != nil || resigned {
				t.Fatalf("SignModule: resigned %v, %v", resigned, err)
			}
			got, err := verifySigned(signed, c.kp.cert, c.hash)
			if err != nil {
				t.Fatalf("the signature does not verify: %v", err)
			}
			if !bytes.Equal(got, mod) {
				t.Fatal("the signed file does not start with the module unchanged")
			}
		})
	}
}

// TestVerifierCatchesFaults corrupts a good signed module the ways a wrong implementation would
// write it: each must fail verification, so that TestSignModuleVerifies can fail.
func TestVerifierCatchesFaults(t *testing.T) {
	kp := rsaPair(t)
	mod := fakeModule(t, "faults", 1024)
	good, _, err := kp.signer(t, crypto.SHA256).SignModule(mod)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verifySigned(good, kp.cert, crypto.SHA256); err != nil {
		t.Fatalf("the good file does not verify: %v", err)
	}
	trailerAt := len(good) - len(Magic) - InfoSize
	sha256OID := []byte{0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01}
	other := keyPair{key: ecdsaPair(t, elliptic.P256()).key, cert: kp.cert}
	otherSig, err := NewSigner(other.key, kp.cert, Options{})
	if err != nil {
		t.Fatal(err)
	}
	faults := map[string]func([]byte) []byte{
		"sig_len little-endian": func(b []byte) []byte {
			n := binary.BigEndian.Uint32(b[trailerAt+8:])
			binary.LittleEndian.PutUint32(b[trailerAt+8:], n)
			return b
		},
		"id_type PKEY_ID_X509": func(b []byte) []byte { b[trailerAt+2] = 1; return b },
		"digest algorithm sha384 in place of sha256": func(b []byte) []byte {
			return bytes.ReplaceAll(b, sha256OID, append(sha256OID[:10:10], 0x02))
		},
		"module byte changed": func(b []byte) []byte { b[100] ^= 1; return b },
		"no magic":            func(b []byte) []byte { return b[:len(b)-1] },
		"signed by another key": func([]byte) []byte {
			s, _, err := otherSig.SignModule(mod)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, corrupt := range faults {
		if _, err := verifySigned(corrupt(bytes.Clone(good)), kp.cert, crypto.SHA256); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if _, err := verifySigned(good, kp.cert, crypto.SHA512); err == nil {
		t.Error("a sha256 signature verified as sha512")
	}
}

// TestResign: a signed module is signed again with its signature replaced, not appended to.
func TestResign(t *testing.T) {
	first, second := rsaPair(t), ecdsaPair(t, elliptic.P256())
	mod := fakeModule(t, "resign", 2048)
	once, _, err := first.signer(t, crypto.SHA256).SignModule(mod)
	if err != nil {
		t.Fatal(err)
	}
	twice, resigned, err := second.signer(t, crypto.SHA256).SignModule(once)
	if err != nil || !resigned {
		t.Fatalf("resigned %v, %v", resigned, err)
	}
	got, err := verifySigned(twice, second.cert, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mod) {
		t.Errorf("the resigned module is %d bytes, want the original %d (one signature)", len(got), len(mod))
	}
}

// TestRefusals: files that are not modules, malformed signatures and oversize modules.
func TestRefusals(t *testing.T) {
	kp := rsaPair(t)
	s, err := NewSigner(kp.key, kp.cert, Options{MaxModuleBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	good := fakeModule(t, "ok", 100)
	signed, _, err := s.SignModule(good)
	if err != nil {
		t.Fatal(err)
	}
	badLen := bytes.Clone(signed)
	binary.LittleEndian.PutUint32(badLen[len(badLen)-len(Magic)-4:], uint32(len(badLen)))
	cases := map[string]struct {
		data []byte
		want Class
	}{
		"text file":      {[]byte("#!/bin/sh\necho hi\n"), ClassNotModule},
		"xz module":      {append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, good...), ClassNotModule},
		"zstd module":    {append([]byte{0x28, 0xb5, 0x2f, 0xfd}, good...), ClassNotModule},
		"ELF executable": {elfObject(t, elf.ET_EXEC, "exe", 10, true), ClassNotModule},
		"no .modinfo":    {elfObject(t, elf.ET_REL, "obj", 10, false), ClassNotModule},
		"empty":          {nil, ClassNotModule},
		"bad sig_len":    {badLen, ClassMalformedSignature},
		"magic only":     {[]byte(Magic), ClassMalformedSignature},
		"too large":      {fakeModule(t, "big", 64<<10), ClassTooLarge},
		"signature only": {Append(nil, []byte("x")), ClassMalformedSignature},
	}
	for name, c := range cases {
		if _, _, err := s.SignModule(c.data); ClassOf(err) != c.want {
			t.Errorf("%s: got %v (class %q), want class %q", name, err, ClassOf(err), c.want)
		}
	}
}

// TestSplitRoundTrip: Split undoes Append and leaves unsigned data alone.
func TestSplitRoundTrip(t *testing.T) {
	mod, sig := []byte("module bytes"), []byte("pkcs7")
	m, s, signed, err := Split(Append(mod, sig))
	if err != nil || !signed || !bytes.Equal(m, mod) || !bytes.Equal(s, sig) {
		t.Fatalf("Split(Append) = %q %q %v %v", m, s, signed, err)
	}
	m, _, signed, err = Split(mod)
	if err != nil || signed || !bytes.Equal(m, mod) {
		t.Fatalf("Split(unsigned) = %q %v %v", m, signed, err)
	}
}

// FuzzSplit: Split never panics, and what it calls signed is exactly module, signature, trailer
// and magic, in the kernel's encoding.
func FuzzSplit(f *testing.F) {
	f.Add([]byte(Magic))
	f.Add(Append([]byte("m"), []byte("sig")))
	f.Add(append([]byte("0123456789ab"), Magic...))
	f.Fuzz(func(t *testing.T, data []byte) {
		mod, sig, signed, err := Split(data)
		switch {
		case err != nil:
			if !bytes.HasSuffix(data, []byte(Magic)) || ClassOf(err) != ClassMalformedSignature {
				t.Fatalf("error %v on %q", err, data)
			}
		case signed:
			if len(mod) == 0 || !bytes.Equal(Append(mod, sig), data) {
				t.Fatalf("Split(%q) = %q, %q: not what Append gives back", data, mod, sig)
			}
		case !bytes.Equal(mod, data) || bytes.HasSuffix(data, []byte(Magic)):
			t.Fatalf("unsigned %q came back as %q", data, mod)
		}
	})
}

// TestNewSignerRefuses: digest algorithms other than SHA-2 and missing keys.
func TestNewSignerRefuses(t *testing.T) {
	kp := rsaPair(t)
	if _, err := NewSigner(kp.key, kp.cert, Options{Hash: crypto.SHA1}); ClassOf(err) != ClassInvalidInput {
		t.Errorf("sha1: %v", err)
	}
	if _, err := NewSigner(nil, kp.cert, Options{}); ClassOf(err) != ClassKey {
		t.Errorf("no key: %v", err)
	}
	if _, err := ParseHash("md5"); err == nil {
		t.Error("md5 accepted")
	}
	if h, err := ParseHash("sha384"); err != nil || h != crypto.SHA384 {
		t.Errorf("sha384: %v %v", h, err)
	}
	if kp.signer(t, 0).Certificate() != kp.cert {
		t.Error("Certificate is not the signer's")
	}
}
