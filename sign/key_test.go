package sign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// TestParseKeyPairFormats: upstream's Secrets hold a PEM key and a DER certificate; PEM and DER of
// both, PKCS#1, SEC 1 and a combined key+certificate file (the kernel's signing_key.pem) work too.
func TestParseKeyPairFormats(t *testing.T) {
	kp := rsaPair(t)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(kp.key)
	if err != nil {
		t.Fatal(err)
	}
	ec := ecdsaPair(t, elliptic.P384())
	sec1, err := x509.MarshalECPrivateKey(ec.key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		key, cert []byte
		want      *x509.Certificate
	}{
		"PKCS#8 PEM, DER cert (upstream)": {pemOf("PRIVATE KEY", pkcs8), kp.cert.Raw, kp.cert},
		"PKCS#8 DER, PEM cert":            {pkcs8, pemOf("CERTIFICATE", kp.cert.Raw), kp.cert},
		"PKCS#1 PEM":                      {pemOf("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(testRSAKey)), kp.cert.Raw, kp.cert},
		"SEC 1 PEM":                       {pemOf("EC PRIVATE KEY", sec1), ec.cert.Raw, ec.cert},
		"combined signing_key.pem":        {append(pemOf("PRIVATE KEY", pkcs8), pemOf("CERTIFICATE", kp.cert.Raw)...), append(pemOf("PRIVATE KEY", pkcs8), pemOf("CERTIFICATE", kp.cert.Raw)...), kp.cert},
	}
	for name, c := range cases {
		key, cert, err := ParseKeyPair(c.key, c.cert)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !cert.Equal(c.want) || !key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(c.want.PublicKey) {
			t.Errorf("%s: wrong key or certificate", name)
		}
	}
}

// TestParseKeyPairRefuses: a key that is not the certificate's, and keys that cannot sign modules.
func TestParseKeyPairRefuses(t *testing.T) {
	kp := rsaPair(t)
	other := ecdsaPair(t, elliptic.P256())
	otherDER, _ := x509.MarshalPKCS8PrivateKey(other.key)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	smallDER, _ := x509.MarshalPKCS8PrivateKey(small)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	p224DER, _ := x509.MarshalPKCS8PrivateKey(p224)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edDER, _ := x509.MarshalPKCS8PrivateKey(edKey)
	encrypted := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00"}, Bytes: []byte{1}})
	cases := map[string]struct {
		key, cert []byte
		want      Class
	}{
		"key of another certificate": {pemOf("PRIVATE KEY", otherDER), kp.cert.Raw, ClassKeyMismatch},
		"RSA 1024":                   {smallDER, kp.cert.Raw, ClassKey},
		"ECDSA P-224":                {p224DER, kp.cert.Raw, ClassKey},
		"Ed25519":                    {edDER, kp.cert.Raw, ClassKey},
		"encrypted PEM":              {encrypted, kp.cert.Raw, ClassKey},
		"PKCS#8 encrypted":           {pemOf("ENCRYPTED PRIVATE KEY", []byte{1}), kp.cert.Raw, ClassKey},
		"garbage key":                {[]byte("not a key"), kp.cert.Raw, ClassKey},
		"PEM without a key":          {pemOf("CERTIFICATE", kp.cert.Raw), kp.cert.Raw, ClassKey},
		"garbage certificate":        {otherDER, []byte("not a cert"), ClassKey},
	}
	for name, c := range cases {
		if _, _, err := ParseKeyPair(c.key, c.cert); ClassOf(err) != c.want {
			t.Errorf("%s: got %v (class %q), want class %q", name, err, ClassOf(err), c.want)
		}
	}
}

// TestReadKeyPairBounds: files over MaxKeyBytes and missing files.
func TestReadKeyPairBounds(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, MaxKeyBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadKeyPair(big, big); ClassOf(err) != ClassTooLarge {
		t.Errorf("oversize key: %v", err)
	}
	if _, _, err := ReadKeyPair(filepath.Join(dir, "missing"), big); ClassOf(err) != ClassKey {
		t.Errorf("missing key: %v", err)
	}
}
