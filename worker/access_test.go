package worker

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/contract"
)

// TestCachedImageNeedsTheModulesOwnAccess: a private image that Module A pulled is in the node's
// cache; Module B of another namespace must prove its own access to the registry before the cache
// serves it.
func TestCachedImageNeedsTheModulesOwnAccess(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{user: "kmm", password: "s3cret"})
	ref, digest := reg.push(t, "kmod/private:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	good, err := ReadKeychain(writeDockerConfig(t, reg.host, "kmm", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	withKeys := func(o *Options) { o.Keychain = good }
	a := testConfig(ref)
	a.Namespace = "team-a"
	mustSucceed(t, newTestWorker(t, s, newRecorder(t), withKeys).Run(context.Background(), contract.ActionLoad, a))
	reg.requests.Store(0)
	mustSucceed(t, newTestWorker(t, s, newRecorder(t), withKeys).Run(context.Background(), contract.ActionLoad, a))
	if n := reg.requests.Load(); n != 0 {
		t.Errorf("Module A's second load made %d registry requests, want 0", n)
	}

	for _, policy := range []corev1.PullPolicy{"", corev1.PullIfNotPresent, corev1.PullNever} {
		b := testConfig(ref)
		b.Namespace = "team-b"
		b.Config.ImagePullPolicy = policy
		m := newRecorder(t)
		res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, b)
		t.Logf("%q without credentials: %s", policy, res.Message)
		if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonImagePull || len(m.calls) != 0 {
			t.Errorf("policy %q: Module B without credentials got %s %s %q after modprobe %q, want ImagePull and nothing loaded",
				policy, res.Outcome, res.Reason, res.Message, m.calls)
		}
		if policy == corev1.PullNever && !strings.Contains(res.Message, "imagePullPolicy is Never") {
			t.Errorf("Never: the message should say why the cache was not used: %q", res.Message)
		}
	}

	b := testConfig(ref)
	b.Namespace = "team-b"
	reg.requests.Store(0)
	reg.blobGets.Store(0)
	res := newTestWorker(t, s, newRecorder(t), withKeys).Run(context.Background(), contract.ActionLoad, b)
	mustSucceed(t, res)
	if !res.FromCache || res.ImageDigest != digest.String() || reg.blobGets.Load() != 0 {
		t.Errorf("Module B with credentials: fromCache %v, digest %s, %d blob downloads; want the cached content after one check", res.FromCache, res.ImageDigest, reg.blobGets.Load())
	}
	reg.requests.Store(0)
	mustSucceed(t, newTestWorker(t, s, newRecorder(t), withKeys).Run(context.Background(), contract.ActionLoad, b))
	if n := reg.requests.Load(); n != 0 {
		t.Errorf("Module B's second load made %d registry requests, want 0", n)
	}
}
