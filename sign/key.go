package sign

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxKeyBytes bounds the key file and the certificate file (a Secret holds at most 1 MiB).
const MaxKeyBytes = 1 << 20

// minRSABits is the smallest RSA key accepted (the kernel's own signing keys are 4096 bits).
const minRSABits = 2048

// ReadKeyPair reads the private key and the certificate files (the Secrets' "key" and "cert",
// mounted into the sign pod) and parses them with ParseKeyPair.
func ReadKeyPair(keyFile, certFile string) (crypto.Signer, *x509.Certificate, error) {
	key, err := readBounded(keyFile, "private key")
	if err != nil {
		return nil, nil, err
	}
	cert, err := readBounded(certFile, "certificate")
	if err != nil {
		return nil, nil, err
	}
	return ParseKeyPair(key, cert)
}

func readBounded(file, what string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, errorf(ClassKey, "reading the %s: %w", what, err)
	}
	defer f.Close() //nolint:errcheck // read-only
	data, err := io.ReadAll(io.LimitReader(f, MaxKeyBytes+1))
	if err != nil {
		return nil, errorf(ClassKey, "reading the %s: %w", what, err)
	}
	if len(data) > MaxKeyBytes {
		return nil, errorf(ClassTooLarge, "the %s file %s is larger than %d bytes", what, file, MaxKeyBytes)
	}
	return data, nil
}

// ParseKeyPair parses a private key (PEM: PKCS#8, PKCS#1 or SEC 1; or the same in DER; a PEM file
// holding a certificate too, like the kernel's signing_key.pem, is fine) and a certificate (PEM
// or DER), and checks that the key is the certificate's. Errors are ClassKey, or
// ClassKeyMismatch when both parse but do not belong together.
func ParseKeyPair(keyData, certData []byte) (crypto.Signer, *x509.Certificate, error) {
	key, err := parseKey(keyData)
	if err != nil {
		return nil, nil, err
	}
	cert, err := parseCert(certData)
	if err != nil {
		return nil, nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, nil, errorf(ClassKeyMismatch, "the private key does not match the certificate %q (serial %s): check keySecret and certSecret", cert.Subject, cert.SerialNumber)
	}
	return key, cert, nil
}

// parseKey finds the private key in PEM or DER data.
func parseKey(data []byte) (crypto.Signer, error) {
	if der, ok, err := pemBlock(data, "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY"); err != nil {
		return nil, err
	} else if ok {
		data = der
	}
	var key any
	var err error
	if key, err = x509.ParsePKCS8PrivateKey(data); err != nil {
		if key, err = x509.ParsePKCS1PrivateKey(data); err != nil {
			if key, err = x509.ParseECPrivateKey(data); err != nil {
				return nil, errorf(ClassKey, "the private key is neither PKCS#8, PKCS#1 nor SEC 1, in PEM or DER")
			}
		}
	}
	return checkKeyType(key)
}

// checkKeyType accepts what the kernel verifies for modules: RSA of at least minRSABits, ECDSA
// on P-256 or P-384.
func checkKeyType(key any) (crypto.Signer, error) {
	switch k := key.(type) {
	case *rsa.PrivateKey:
		if k.N.BitLen() < minRSABits {
			return nil, errorf(ClassKey, "RSA key of %d bits, fewer than %d", k.N.BitLen(), minRSABits)
		}
		return k, nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, errorf(ClassKey, "ECDSA key on %s: the kernel verifies module signatures on P-256 and P-384 only", k.Curve.Params().Name)
		}
		return k, nil
	default:
		return nil, errorf(ClassKey, "a %T private key: module signatures take RSA or ECDSA keys", key)
	}
}

// parseCert parses the first certificate of PEM data, or DER data.
func parseCert(data []byte) (*x509.Certificate, error) {
	if der, ok, err := pemBlock(data, "CERTIFICATE"); err != nil {
		return nil, err
	} else if ok {
		data = der
	}
	cert, err := x509.ParseCertificate(data)
	if err != nil {
		return nil, errorf(ClassKey, "the certificate is not an X.509 certificate in PEM or DER: %w", err)
	}
	return cert, nil
}

// pemBlock returns the bytes of the first PEM block of one of the types, ok=false when data is
// not PEM at all (then it may be DER). An encrypted key is refused.
func pemBlock(data []byte, types ...string) ([]byte, bool, error) {
	sawPEM := false
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		sawPEM = true
		for _, t := range types {
			if b.Type != t {
				continue
			}
			if t == "ENCRYPTED PRIVATE KEY" || b.Headers["Proc-Type"] == "4,ENCRYPTED" {
				return nil, true, errorf(ClassKey, "the private key is encrypted: give it unencrypted (sign-file's KBUILD_SIGN_PIN has no counterpart)")
			}
			return b.Bytes, true, nil
		}
	}
	if sawPEM {
		return nil, true, errorf(ClassKey, "no PEM block of type %q", types[0])
	}
	return nil, false, nil
}

// errNoKey is returned by a Signer without a key (the zero value).
var errNoKey = errors.New("sign: the signer has no key")

// describeKey names a key for messages.
func describeKey(cert *x509.Certificate) string {
	return fmt.Sprintf("%q (serial %s)", cert.Subject, cert.SerialNumber)
}
