package app

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kmm-project/kmm/test/envtest"
)

// failingDiscovery answers the first n discovery requests (GET /api, /apis and below) itself
// with 503, as a restarting kube-apiserver or priority and fairness does, and sends the rest on.
type failingDiscovery struct {
	next   http.RoundTripper
	n      int32
	failed atomic.Int32
}

func (f *failingDiscovery) RoundTrip(req *http.Request) (*http.Response, error) {
	p := req.URL.Path
	discovery := req.Method == http.MethodGet && (p == "/api" || p == "/apis" || strings.Count(p, "/") <= 3 && strings.HasPrefix(p, "/apis/"))
	if discovery && f.failed.Add(1) <= f.n {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Request: req,
			Header: http.Header{"Content-Type": []string{"text/plain"}}, Body: io.NopCloser(strings.NewReader("restarting"))}, nil
	}
	return f.next.RoundTrip(req)
}

// TestNewWaitsForDiscovery builds the manager on a real API server whose first discovery answers
// fail: New tries again (startupBackoff) and succeeds instead of ending the process. With one try
// only (the seeded fault: the behaviour before newManagerWaiting) New fails.
func TestNewWaitsForDiscovery(t *testing.T) {
	env, err := envtest.StartWith(envtest.Options{Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	build := func(t *testing.T) (*failingDiscovery, error) {
		cfg := rest.CopyConfig(env.Config)
		fd := &failingDiscovery{n: 3}
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { fd.next = rt; return fd })
		_, err := New(cfg, bareOptions())
		return fd, err
	}
	t.Run("waits", func(t *testing.T) {
		fd, err := build(t)
		if err != nil {
			t.Fatalf("New with %d failed discovery answers: %v", fd.n, err)
		}
		if got := fd.failed.Load(); got <= fd.n {
			t.Fatalf("%d discovery requests made, want more than the %d failed ones", got, fd.n)
		}
	})
	t.Run("seeded fault: one try", func(t *testing.T) {
		saved := startupBackoff
		startupBackoff.Steps = 1
		t.Cleanup(func() { startupBackoff = saved })
		if _, err := build(t); err == nil {
			t.Fatal("New succeeded with one try although discovery failed: the test cannot tell a waiting New from one that ends")
		}
	})
}
