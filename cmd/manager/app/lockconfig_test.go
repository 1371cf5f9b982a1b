package app

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestLeaderElectionLeavesRequestsUntimed runs the manager with leader election (renew deadline
// 2 s) on a real API server and watches Nodes through its cache for 4 s: one watch request lives
// through it. The leader election lock's client times its requests out at half the renew deadline;
// when that timeout reached the manager's own config (the lock built on cfg itself, not a copy: the
// seeded fault), every watch was cut after a second and made again, and a LIST slower than that
// never let a cache sync.
func TestLeaderElectionLeavesRequestsUntimed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env, _, o := electionBed(ctx, t, "kmm-lock-config")
	var nodeWatches atomic.Int32
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.URL.Query().Get("watch") == "true" && strings.HasSuffix(r.URL.Path, "/nodes") {
				nodeWatches.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	mgr, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := mgr.GetConfig().Timeout; got != 0 {
		t.Errorf("the manager's requests time out after %v, want no client timeout", got)
	}
	go func() { _ = mgr.Start(ctx) }()
	if _, err := mgr.GetCache().GetInformer(ctx, &corev1.Node{}); err != nil {
		t.Fatal(err)
	}
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}
	time.Sleep(4 * time.Second)
	if n := nodeWatches.Load(); n != 1 {
		t.Errorf("%d watch requests for Nodes in 4 s, want 1 (a watch cut by a client timeout is made again)", n)
	}
}
