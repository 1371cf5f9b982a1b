package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// kubeletClientUser is the user the API server is to the kubelet (logs, exec, port-forward): a
// client certificate from its own CA, which the kubelet trusts (authentication.x509.clientCAFile)
// and authorizes through the API server (bound to system:kubelet-api-admin).
const kubeletClientUser = "kube-apiserver-kubelet-client"

// kubeletClientCerts are the files of writeKubeletClientCerts.
type kubeletClientCerts struct {
	CA, Cert, Key string
}

// writeKubeletClientCerts writes a CA and a client certificate it signs for kubeletClientUser into
// dir.
func writeKubeletClientCerts(dir string) (kubeletClientCerts, error) {
	files := kubeletClientCerts{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "client.crt"), Key: filepath.Join(dir, "client.key")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return files, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kmm-e2e-kubelet-client-ca"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return files, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: kubeletClientUser},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		return files, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return files, err
	}
	for path, block := range map[string]*pem.Block{
		files.CA:   {Type: "CERTIFICATE", Bytes: caDER},
		files.Cert: {Type: "CERTIFICATE", Bytes: der},
		files.Key:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return files, err
		}
	}
	return files, nil
}
