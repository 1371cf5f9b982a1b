package sign

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"debug/elf"
	"encoding/asn1"
	"fmt"

	"github.com/smallstep/pkcs7"
)

// DefaultMaxModuleBytes bounds one module file (the largest vendor modules are about 100 MiB).
const DefaultMaxModuleBytes int64 = 256 << 20

// Options are a Signer's settings.
type Options struct {
	// Hash is the digest algorithm: crypto.SHA256 (the default, sign-file's usual argument),
	// crypto.SHA384 or crypto.SHA512.
	Hash crypto.Hash
	// MaxModuleBytes bounds one module (DefaultMaxModuleBytes when 0).
	MaxModuleBytes int64
}

// Signer signs modules with one key and its certificate.
type Signer struct {
	key  crypto.Signer
	cert *x509.Certificate
	opts Options
}

// NewSigner returns a Signer for a key and its certificate (ParseKeyPair or ReadKeyPair checked
// that they match).
func NewSigner(key crypto.Signer, cert *x509.Certificate, opts Options) (*Signer, error) {
	if opts.Hash == 0 {
		opts.Hash = crypto.SHA256
	}
	if opts.MaxModuleBytes == 0 {
		opts.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if _, ok := digestOIDs[opts.Hash]; !ok {
		return nil, errorf(ClassInvalidInput, "digest algorithm %s: use sha256, sha384 or sha512", opts.Hash)
	}
	if key == nil || cert == nil {
		return nil, &Error{Class: ClassKey, Err: errNoKey}
	}
	return &Signer{key: key, cert: cert, opts: opts}, nil
}

// ParseHash maps sign-file's digest argument (sha256, sha384, sha512) to a crypto.Hash.
func ParseHash(name string) (crypto.Hash, error) {
	for h, n := range hashNames {
		if n == name {
			return h, nil
		}
	}
	return 0, errorf(ClassInvalidInput, "digest algorithm %q: use sha256, sha384 or sha512", name)
}

var hashNames = map[crypto.Hash]string{crypto.SHA256: "sha256", crypto.SHA384: "sha384", crypto.SHA512: "sha512"}

// digestOIDs are the digest algorithms of the SignedData.
var digestOIDs = map[crypto.Hash]asn1.ObjectIdentifier{
	crypto.SHA256: pkcs7.OIDDigestAlgorithmSHA256,
	crypto.SHA384: pkcs7.OIDDigestAlgorithmSHA384,
	crypto.SHA512: pkcs7.OIDDigestAlgorithmSHA512,
}

// ecdsaOIDs are the signature algorithms of an ECDSA signer, by digest (the kernel's
// pkcs7_sig_note_pkey_algo accepts these and rsaEncryption).
var ecdsaOIDs = map[crypto.Hash]asn1.ObjectIdentifier{
	crypto.SHA256: pkcs7.OIDDigestAlgorithmECDSASHA256,
	crypto.SHA384: pkcs7.OIDDigestAlgorithmECDSASHA384,
	crypto.SHA512: pkcs7.OIDDigestAlgorithmECDSASHA512,
}

// Certificate is the signer's certificate.
func (s *Signer) Certificate() *x509.Certificate { return s.cert }

// SignModule checks that data is an ELF kernel module and returns it with a signature appended.
// A module that is signed already is signed again: its signature is replaced (resigned is true),
// since the kernel checks one signature only, the last one (sign-file would append a second
// signature after the first, which the kernel then reads as part of the module). A file that is
// not a module, or whose existing signature is malformed, is refused.
func (s *Signer) SignModule(data []byte) (signed []byte, resigned bool, err error) {
	if int64(len(data)) > s.opts.MaxModuleBytes {
		return nil, false, errorf(ClassTooLarge, "the module is %d bytes, more than %d", len(data), s.opts.MaxModuleBytes)
	}
	module, _, resigned, err := Split(data)
	if err != nil {
		return nil, false, err
	}
	if err := CheckModule(module); err != nil {
		return nil, false, err
	}
	sig, err := s.Signature(module)
	if err != nil {
		return nil, false, err
	}
	return Append(module, sig), resigned, nil
}

// compressed are the magic numbers of the compressions the kernel's modules come in.
var compressed = map[string][]byte{"xz": {0xfd, '7', 'z', 'X', 'Z', 0}, "zstd": {0x28, 0xb5, 0x2f, 0xfd}, "gzip": {0x1f, 0x8b}}

// CheckModule refuses data that is not an ELF relocatable object with a .modinfo section, which
// every kernel module is (ClassNotModule).
func CheckModule(data []byte) error {
	for name, magic := range compressed {
		if bytes.HasPrefix(data, magic) {
			return errorf(ClassNotModule, "a %s-compressed file: sign the module before it is compressed (the kernel checks the signature inside)", name)
		}
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return errorf(ClassNotModule, "not an ELF file: %w", err)
	}
	if f.Type != elf.ET_REL {
		return errorf(ClassNotModule, "an ELF file of type %s, not a kernel module (ET_REL)", f.Type)
	}
	if f.Section(".modinfo") == nil {
		return errorf(ClassNotModule, "an ELF object without a .modinfo section, not a kernel module")
	}
	return nil
}

// Signature returns the detached PKCS#7 SignedData over module, as sign-file writes it.
func (s *Signer) Signature(module []byte) ([]byte, error) {
	sd, err := pkcs7.NewSignedData(module)
	if err != nil {
		return nil, classify(ClassInvalidInput, err)
	}
	sd.SetDigestAlgorithm(digestOIDs[s.opts.Hash])
	encryption := pkcs7.OIDEncryptionAlgorithmRSA
	if _, ok := s.key.(*ecdsa.PrivateKey); ok {
		encryption = ecdsaOIDs[s.opts.Hash]
	}
	sd.SetEncryptionAlgorithm(encryption)
	if err := sd.SignWithoutAttr(s.cert, s.key, pkcs7.SignerInfoConfig{}); err != nil {
		return nil, errorf(ClassKey, "signing with %s: %w", describeKey(s.cert), err)
	}
	sd.Detach()
	return finish(sd, encryption)
}

// contentInfo is the outer ContentInfo of a PKCS#7 message.
type contentInfo struct {
	ContentType asn1.ObjectIdentifier
	Content     asn1.RawValue
}

// finish encodes the SignedData without the signer's certificate, which SignWithoutAttr adds and
// Finish would encode (sign-file passes CMS_NOCERTS: the kernel finds the key in its keyring by
// issuer and serial). Like OpenSSL it gives rsaEncryption its NULL parameters.
func finish(sd *pkcs7.SignedData, encryption asn1.ObjectIdentifier) ([]byte, error) {
	inner := sd.GetSignedData()
	if encryption.Equal(pkcs7.OIDEncryptionAlgorithmRSA) {
		for i := range inner.SignerInfos {
			inner.SignerInfos[i].DigestEncryptionAlgorithm.Parameters = asn1.NullRawValue
		}
	}
	der, err := asn1.Marshal(*inner)
	if err != nil {
		return nil, fmt.Errorf("encoding the SignedData: %w", err)
	}
	return asn1.Marshal(contentInfo{
		ContentType: pkcs7.OIDSignedData,
		Content:     asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: der},
	})
}
