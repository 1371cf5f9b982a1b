package sign

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
)

// This file is the tests' own reading of a signed module, written from the kernel's format
// (include/linux/module_signature.h, crypto/asymmetric_keys/pkcs7.asn1) with encoding/asn1 and
// crypto/*, sharing no code with the package: a bug in Split or in the PKCS#7 encoding does not
// hide itself.

var (
	oidData          = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 1}
	oidSignedData    = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 2}
	oidRSAEncryption = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	oidDigest        = map[crypto.Hash]asn1.ObjectIdentifier{
		crypto.SHA256: {2, 16, 840, 1, 101, 3, 4, 2, 1},
		crypto.SHA384: {2, 16, 840, 1, 101, 3, 4, 2, 2},
		crypto.SHA512: {2, 16, 840, 1, 101, 3, 4, 2, 3},
	}
	oidECDSA = map[crypto.Hash]asn1.ObjectIdentifier{
		crypto.SHA256: {1, 2, 840, 10045, 4, 3, 2},
		crypto.SHA384: {1, 2, 840, 10045, 4, 3, 3},
		crypto.SHA512: {1, 2, 840, 10045, 4, 3, 4},
	}
)

type tContentInfo struct {
	ContentType asn1.ObjectIdentifier
	Content     asn1.RawValue `asn1:"explicit,tag:0"`
}

type tSignedData struct {
	Version          int
	DigestAlgorithms []pkix.AlgorithmIdentifier `asn1:"set"`
	Encap            tEncap
	Certificates     asn1.RawValue `asn1:"optional,tag:0"`
	CRLs             asn1.RawValue `asn1:"optional,tag:1"`
	SignerInfos      []tSignerInfo `asn1:"set"`
}

type tEncap struct {
	ContentType asn1.ObjectIdentifier
	Content     asn1.RawValue `asn1:"optional,explicit,tag:0"`
}

type tSignerInfo struct {
	Version            int
	Issuer             tIssuerSerial
	DigestAlgorithm    pkix.AlgorithmIdentifier
	SignedAttrs        asn1.RawValue `asn1:"optional,tag:0"`
	SignatureAlgorithm pkix.AlgorithmIdentifier
	Signature          []byte
	UnsignedAttrs      asn1.RawValue `asn1:"optional,tag:1"`
}

type tIssuerSerial struct {
	Issuer asn1.RawValue
	Serial *big.Int
}

// verifySigned checks that signed is a module with a signature the kernel would accept from the
// key of cert with digest h, and returns the module bytes without it.
func verifySigned(signed []byte, cert *x509.Certificate, h crypto.Hash) ([]byte, error) {
	const magic = "~Module signature appended~\n"
	if !bytes.HasSuffix(signed, []byte(magic)) {
		return nil, errors.New("no signature magic")
	}
	body := signed[:len(signed)-len(magic)]
	if len(body) < 12 {
		return nil, errors.New("no room for struct module_signature")
	}
	trailer := body[len(body)-12:]
	if want := []byte{0, 0, 2, 0, 0, 0, 0, 0}; !bytes.Equal(trailer[:8], want) {
		return nil, fmt.Errorf("module_signature fields % x, want % x (id_type PKEY_ID_PKCS7, the rest zero)", trailer[:8], want)
	}
	sigLen := int(binary.BigEndian.Uint32(trailer[8:]))
	if sigLen >= len(body)-12 {
		return nil, fmt.Errorf("sig_len %d too long for %d bytes", sigLen, len(body)-12)
	}
	module, sig := body[:len(body)-12-sigLen], body[len(body)-12-sigLen:len(body)-12]
	si, err := parsePKCS7(sig, h)
	if err != nil {
		return nil, err
	}
	if err := checkSigner(si, cert, h); err != nil {
		return nil, err
	}
	d := h.New()
	d.Write(module)
	return module, verifyDigest(cert.PublicKey, h, d.Sum(nil), si.Signature)
}

// parsePKCS7 reads the SignedData as sign-file writes it and returns its one signer.
func parsePKCS7(der []byte, h crypto.Hash) (tSignerInfo, error) {
	var ci tContentInfo
	if rest, err := asn1.Unmarshal(der, &ci); err != nil || len(rest) != 0 {
		return tSignerInfo{}, fmt.Errorf("ContentInfo: %v (%d bytes left)", err, len(rest))
	}
	if !ci.ContentType.Equal(oidSignedData) {
		return tSignerInfo{}, fmt.Errorf("content type %s, not signedData", ci.ContentType)
	}
	var sd tSignedData
	if rest, err := asn1.Unmarshal(ci.Content.Bytes, &sd); err != nil || len(rest) != 0 {
		return tSignerInfo{}, fmt.Errorf("SignedData: %v (%d bytes left)", err, len(rest))
	}
	switch {
	case sd.Version != 1:
		return tSignerInfo{}, fmt.Errorf("SignedData version %d, want 1 (issuer and serial)", sd.Version)
	case len(sd.DigestAlgorithms) != 1 || !sd.DigestAlgorithms[0].Algorithm.Equal(oidDigest[h]):
		return tSignerInfo{}, fmt.Errorf("digest algorithms %v, want [%s]", sd.DigestAlgorithms, oidDigest[h])
	case !sd.Encap.ContentType.Equal(oidData) || len(sd.Encap.Content.FullBytes) != 0:
		return tSignerInfo{}, fmt.Errorf("encapsulated content %s with %d bytes, want detached data", sd.Encap.ContentType, len(sd.Encap.Content.FullBytes))
	case len(sd.Certificates.FullBytes) != 0 || len(sd.CRLs.FullBytes) != 0:
		return tSignerInfo{}, errors.New("certificates or CRLs in the message (sign-file passes CMS_NOCERTS)")
	case len(sd.SignerInfos) != 1:
		return tSignerInfo{}, fmt.Errorf("%d signers, want 1", len(sd.SignerInfos))
	}
	return sd.SignerInfos[0], nil
}

// checkSigner checks the SignerInfo names cert and the algorithms the kernel accepts.
func checkSigner(si tSignerInfo, cert *x509.Certificate, h crypto.Hash) error {
	switch {
	case si.Version != 1:
		return fmt.Errorf("SignerInfo version %d, want 1", si.Version)
	case !bytes.Equal(si.Issuer.Issuer.FullBytes, cert.RawIssuer) || si.Issuer.Serial.Cmp(cert.SerialNumber) != 0:
		return errors.New("the signer is not the certificate's issuer and serial")
	case !si.DigestAlgorithm.Algorithm.Equal(oidDigest[h]):
		return fmt.Errorf("signer digest %s, want %s", si.DigestAlgorithm.Algorithm, oidDigest[h])
	case len(si.SignedAttrs.FullBytes) != 0 || len(si.UnsignedAttrs.FullBytes) != 0:
		return errors.New("attributes present (sign-file passes CMS_NOATTR)")
	}
	switch cert.PublicKey.(type) {
	case *rsa.PublicKey:
		p := si.SignatureAlgorithm
		if !p.Algorithm.Equal(oidRSAEncryption) || p.Parameters.Tag != asn1.TagNull {
			return fmt.Errorf("signature algorithm %s (params tag %d), want rsaEncryption with NULL", p.Algorithm, p.Parameters.Tag)
		}
	case *ecdsa.PublicKey:
		if !si.SignatureAlgorithm.Algorithm.Equal(oidECDSA[h]) {
			return fmt.Errorf("signature algorithm %s, want %s", si.SignatureAlgorithm.Algorithm, oidECDSA[h])
		}
	}
	return nil
}

func verifyDigest(pub crypto.PublicKey, h crypto.Hash, digest, sig []byte) error {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, h, digest, sig)
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, digest, sig) {
			return errors.New("ECDSA signature does not verify")
		}
		return nil
	}
	return fmt.Errorf("key type %T", pub)
}
