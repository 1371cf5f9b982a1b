package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/sign"
)

// writeKeyPair writes a key (PKCS#8 PEM) and its self-signed certificate (DER), the formats of
// upstream's Secrets, and returns their files.
func writeKeyPair(t *testing.T, dir string, key crypto.Signer) (string, string) {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "kmm sign test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyFile, certFile := filepath.Join(dir, "key"), filepath.Join(dir, "cert")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, der, 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile, certFile
}

// TestSignEndToEnd runs `worker sign` against a registry behind basic auth: the result names the
// pushed image's digest and the module in it carries a signature over the unsigned module.
func TestSignEndToEnd(t *testing.T) {
	ref, host := pushKmodImage(t)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyFile, certFile := writeKeyPair(t, dir, key)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherKey, _ := writeKeyPair(t, t.TempDir(), other)
	secret := filepath.Join(dir, "secret.json")
	auth := base64.StdEncoding.EncodeToString([]byte("kmm:pw"))
	if err := os.WriteFile(secret, fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth), 0o600); err != nil {
		t.Fatal(err)
	}
	target := host + "/kmod/cmd-signed:v1"
	cfg := fmt.Sprintf(`{"namespace":"ns","name":"m","kernel":%q,"unsignedImage":%q,"image":%q,"filesToSign":["/opt/lib/modules/%s/extra/*.ko"]}`, kernel, ref, target, kernel)
	cases := map[string]struct {
		config string
		args   []string
		code   int
		reason contract.Reason
	}{
		"signs":          {cfg, []string{"--key", keyFile, "--cert", certFile, "--pull-secret", secret}, exitSucceeded, ""},
		"key mismatch":   {cfg, []string{"--key", otherKey, "--cert", certFile, "--pull-secret", secret}, exitFailed, contract.ReasonSignKey},
		"missing key":    {cfg, []string{"--key", filepath.Join(dir, "absent"), "--cert", certFile}, exitFailed, contract.ReasonSignKey},
		"no credentials": {cfg, []string{"--key", keyFile, "--cert", certFile}, exitFailed, contract.ReasonImagePull},
		"no match":       {strings.Replace(cfg, "*.ko", "absent.ko", 1), []string{"--key", keyFile, "--cert", certFile, "--pull-secret", secret}, exitFailed, contract.ReasonSignInput},
		"invalid config": {`{"namespace":"ns"}`, []string{"--key", keyFile, "--cert", certFile}, exitFailed, contract.ReasonInvalidConfig},
		"digest md5":     {cfg, []string{"--key", keyFile, "--cert", certFile, "--hash", "md5"}, exitFailed, contract.ReasonInvalidConfig},
	}
	for n, c := range cases {
		t.Run(n, func(t *testing.T) {
			e := newEnv(t, c.config)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"sign", "--config", e.config, "--termination-log", e.termLog}, c.args...), &stdout, &stderr)
			res := e.result(t)
			if code != c.code || res.Action != contract.ActionSign || res.Reason != c.reason || res.Namespace != "ns" {
				t.Fatalf("exit %d, result %+v; want exit %d, reason %q\nlog: %s", code, res, c.code, c.reason, stderr.String())
			}
			if c.code == exitSucceeded {
				checkSignedModule(t, target, res.ImageDigest)
			}
		})
	}
}

// checkSignedModule pulls the signed image and checks its module carries a signature.
func checkSignedModule(t *testing.T, target, digest string) {
	t.Helper()
	ref, _ := name.ParseReference(target)
	img, err := remote.Image(ref, remote.WithAuth(&authn.Basic{Username: "kmm", Password: "pw"}))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d.String() != digest {
		t.Errorf("pushed %s, result says %s", d, digest)
	}
	layers, _ := img.Layers()
	rc, err := layers[len(layers)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close() //nolint:errcheck // test
	data := new(bytes.Buffer)
	if _, err := data.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data.Bytes(), []byte(sign.Magic)) || !bytes.Contains(data.Bytes(), []byte("kmm_cmd")) {
		t.Error("the new layer holds no signed module")
	}
}

func TestSignUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"sign"}, {"sign", "--config", "x", "extra"}, {"sign", "--config", "x", "--timeout", "0s"}} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}
