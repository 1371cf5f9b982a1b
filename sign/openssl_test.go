package sign

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestSameBytesAsOpenSSL: an RSA PKCS#1 v1.5 signature is deterministic, so the SignedData must be
// byte for byte what OpenSSL's CMS code writes with the flags sign-file passes (binary, detached,
// no certificates, no attributes). openssl is part of every Debian with ca-certificates.
func TestSameBytesAsOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal("openssl is missing: install the Debian package openssl")
	}
	kp := rsaPair(t)
	dir := t.TempDir()
	pkcs8, err := x509.MarshalPKCS8PrivateKey(kp.key)
	if err != nil {
		t.Fatal(err)
	}
	mod := fakeModule(t, "openssl", 10000)
	files := map[string][]byte{"key.pem": pemOf("PRIVATE KEY", pkcs8), "cert.pem": pemOf("CERTIFICATE", kp.cert.Raw), "mod.ko": mod}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []crypto.Hash{crypto.SHA256, crypto.SHA512} {
		out := filepath.Join(dir, "sig-"+hashNames[h])
		cmd := exec.Command(openssl, "cms", "-sign", "-binary", "-noattr", "-nocerts", "-outform", "DER", "-md", hashNames[h],
			"-signer", filepath.Join(dir, "cert.pem"), "-inkey", filepath.Join(dir, "key.pem"), "-in", filepath.Join(dir, "mod.ko"), "-out", out)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, msg)
		}
		want, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kp.signer(t, h).Signature(mod)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes differ from openssl's %d:\n got % x\nwant % x", hashNames[h], len(got), len(want), got, want)
		}
	}
}
