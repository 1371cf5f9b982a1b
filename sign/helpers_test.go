package sign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"io"
	"log"
	"math/big"
	"testing"
	"time"

	"github.com/kmm-project/kmm/sign/signtest"
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

// fakeModule is signtest.FakeModule.
func fakeModule(t testing.TB, name string, pad int) []byte {
	t.Helper()
	return signtest.FakeModule(name, pad)
}

// elfObject is signtest.ELFObject.
func elfObject(t testing.TB, typ elf.Type, name string, pad int, modinfo bool) []byte {
	t.Helper()
	return signtest.ELFObject(typ, name, pad, modinfo)
}

func nil2P256() elliptic.Curve { return elliptic.P256() }

// nopLogger silences the in-process registry.
func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }
