package certs

import (
	"context"
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// issue returns a CA and a certificate it signed for names.
func issue(t *testing.T, names ...string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	r := &rotator.CertRotator{CAName: "test-ca", CAOrganization: "kmm", DNSName: names[0], ExtraDNSNames: names[1:], ExtKeyUsages: &[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	now := time.Now()
	ca, err := r.CreateCACert(now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err = r.CreateCertPEM(ca, now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM, certPEM, keyPEM
}

func TestDNSNamesCoverTheMetricsService(t *testing.T) {
	o := DefaultOptions()
	want := []string{"kmm-webhook-service.kmm-system.svc", "kmm-webhook-service.kmm-system.svc.cluster.local",
		"kmm-metrics-service.kmm-system.svc", "kmm-metrics-service.kmm-system.svc.cluster.local"}
	if got := o.DNSNames(); !slices.Equal(got, want) {
		t.Errorf("DNSNames() = %v, want %v", got, want)
	}
	o.MetricsServiceName = ""
	if got := o.DNSNames(); !slices.Equal(got, want[:2]) {
		t.Errorf("without a metrics Service: %v, want %v", got, want[:2])
	}
}

// TestFileCertificateServesTheFilesAsTheyAre checks the metrics server's certificate source: no
// files, an error; then the pair in the directory; a half-written pair keeps the one before; a
// new complete pair is served at the next handshake.
func TestFileCertificateServesTheFilesAsTheyAre(t *testing.T) {
	dir := t.TempDir()
	f := &FileCertificate{Dir: dir}
	if _, err := f.GetCertificate(nil); err == nil {
		t.Fatal("a certificate without files")
	}
	_, cert1, key1 := issue(t, "one.kmm-system.svc")
	_, cert2, key2 := issue(t, "two.kmm-system.svc")
	leaf := func() string {
		t.Helper()
		c, err := f.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x.DNSNames[0]
	}
	if _, err := WriteFiles(dir, map[string][]byte{KeyFile: key1, CertFile: cert1}); err != nil {
		t.Fatal(err)
	}
	if got := leaf(); got != "one.kmm-system.svc" {
		t.Fatalf("serves %s, want one", got)
	}
	time.Sleep(10 * time.Millisecond) // a modification time of its own
	if _, err := WriteFiles(dir, map[string][]byte{KeyFile: key2}); err != nil {
		t.Fatal(err)
	}
	if got := leaf(); got != "one.kmm-system.svc" {
		t.Fatalf("with the new key and the old certificate, serves %s, want the pair before", got)
	}
	if _, err := WriteFiles(dir, map[string][]byte{CertFile: cert2}); err != nil {
		t.Fatal(err)
	}
	if got := leaf(); got != "two.kmm-system.svc" {
		t.Fatalf("serves %s after the rotation, want two", got)
	}
}

// TestEnsureSecretDropsACertificateWithoutEveryName checks the upgrade path: a Secret whose serving
// certificate lacks the metrics name loses it (not the CA), one with every name is left alone.
func TestEnsureSecretDropsACertificateWithoutEveryName(t *testing.T) {
	o := DefaultOptions()
	for _, c := range []struct {
		name  string
		names []string
		kept  bool
	}{
		{"webhook names only", o.DNSNames()[:2], false},
		{"every name", o.DNSNames(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ca, cert, key := issue(t, c.names...)
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.SecretName},
				Data: map[string][]byte{CAFile: ca, "ca.key": []byte("k"), CertFile: cert, KeyFile: key}}
			cl := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(s).Build()
			if err := EnsureSecret(context.Background(), cl, o); err != nil {
				t.Fatal(err)
			}
			got := &corev1.Secret{}
			if err := cl.Get(context.Background(), client.ObjectKeyFromObject(s), got); err != nil {
				t.Fatal(err)
			}
			if kept := len(got.Data[CertFile]) > 0 && len(got.Data[KeyFile]) > 0; kept != c.kept {
				t.Errorf("serving certificate kept: %v, want %v", kept, c.kept)
			}
			if string(got.Data[CAFile]) != string(ca) || string(got.Data["ca.key"]) != "k" {
				t.Error("the CA changed")
			}
		})
	}
}
