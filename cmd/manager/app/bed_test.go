package app

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/test/envtest"
)

// bareOptions are the options of a manager with nothing but its clients and cache: no webhook, no
// controllers, metrics and probes on free ports.
func bareOptions() Options {
	o := DefaultOptions()
	o.MetricsAddr, o.ProbeAddr, o.DisableWebhook, o.DisableControllers = "0", "0", true, true
	return o
}

// electionBed starts a bare control plane (stopped at the test's end), creates the namespace ns,
// and returns the control plane, an administrator's client and bareOptions electing a leader in ns
// with a 4 s Lease, a 2 s renew deadline and a 200 ms retry period.
func electionBed(ctx context.Context, t *testing.T, ns string) (*envtest.Env, client.Client, Options) {
	t.Helper()
	env, err := envtest.StartWith(envtest.Options{Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	o := bareOptions()
	o.LeaderElect, o.LeaderElectNamespace = true, ns
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 4*time.Second, 2*time.Second, 200*time.Millisecond
	return env, admin, o
}
