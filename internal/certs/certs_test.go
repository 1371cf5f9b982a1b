package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
)

func TestValidate(t *testing.T) {
	ok := DefaultOptions()
	ok.CertDir = "/certs"
	cases := map[string]struct {
		change func(*Options)
		want   string
	}{
		"defaults":              {change: func(*Options) {}},
		"no directory":          {change: func(o *Options) { o.CertDir = "" }, want: "must all be set"},
		"no Secret":             {change: func(o *Options) { o.SecretName = "" }, want: "must all be set"},
		"renewed after it ends": {change: func(o *Options) { o.RefreshBefore = o.Validity }, want: "must exceed cert-refresh-before"},
		"checked too rarely": {change: func(o *Options) {
			o.Validity, o.RefreshBefore, o.CheckInterval = 10*time.Second, 5*time.Second, 5*time.Second
		}, want: "must exceed"},
		"no check": {change: func(o *Options) { o.CheckInterval = 0 }, want: "all positive"},
		"short, as in the tests": {change: func(o *Options) {
			o.Validity, o.RefreshBefore, o.CheckInterval = 20*time.Second, 14*time.Second, time.Second
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := ok
			tc.change(&o)
			err := o.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if got := ok.DNSName(); got != "kmm-webhook-service.kmm-system.svc" {
		t.Errorf("DNSName() = %q", got)
	}
}

func TestWriteFilesReplacesOnlyWhatChanged(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	files := map[string][]byte{CAFile: []byte("ca"), KeyFile: []byte("key"), CertFile: []byte("cert")}
	if changed, err := WriteFiles(dir, files); err != nil || !changed {
		t.Fatalf("first write: %v, %v", changed, err)
	}
	if changed, err := WriteFiles(dir, files); err != nil || changed {
		t.Fatalf("the same files again: changed %v, %v", changed, err)
	}
	before, _ := os.Stat(filepath.Join(dir, CAFile))
	files[CertFile], files[KeyFile] = []byte("cert2"), []byte("key2")
	if changed, err := WriteFiles(dir, files); err != nil || !changed {
		t.Fatalf("a new certificate: %v, %v", changed, err)
	}
	after, _ := os.Stat(filepath.Join(dir, CAFile))
	if !os.SameFile(before, after) {
		t.Error("the unchanged ca.crt was rewritten")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Errorf("%d entries, want the 3 files and no temporary one: %v", len(entries), entries)
	}
	for name, want := range files {
		got, _ := os.ReadFile(filepath.Join(dir, name))
		if string(got) != string(want) {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	info, _ := os.Stat(filepath.Join(dir, KeyFile))
	if info.Mode().Perm()&0o077 != 0 {
		t.Errorf("the key is readable by others: %v", info.Mode())
	}
}

// TestServingCheckerVerifiesAsTheAPIServer serves a certificate made by cert-controller for one
// DNS name and checks that the readiness check accepts it for that name only, and only once ready.
func TestServingCheckerVerifiesAsTheAPIServer(t *testing.T) {
	const dnsName = "kmm-webhook-service.kmm-system.svc"
	r := &rotator.CertRotator{CAName: "test-ca", CAOrganization: "kmm", DNSName: dnsName, ExtKeyUsages: &[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	now := time.Now()
	ca, err := r.CreateCACert(now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := r.CreateCertPEM(ca, now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	host, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	dir := t.TempDir()
	if _, err := WriteFiles(dir, map[string][]byte{CAFile: ca.CertPEM}); err != nil {
		t.Fatal(err)
	}

	ready := make(chan struct{})
	if err := ServingChecker(ready, host, port, dir, dnsName)(nil); err == nil || !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("before ready: %v", err)
	}
	close(ready)
	if err := ServingChecker(ready, host, port, dir, dnsName)(nil); err != nil {
		t.Fatalf("a valid certificate: %v", err)
	}
	if err := ServingChecker(ready, host, port, dir, "other.kmm-system.svc")(nil); err == nil {
		t.Fatal("a certificate for another name was accepted")
	}
	if err := ServingChecker(ready, host, port, t.TempDir(), dnsName)(nil); err == nil {
		t.Fatal("no CA file, yet ready")
	}
}
