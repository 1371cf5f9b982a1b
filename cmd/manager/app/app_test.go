package app

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kmm-project/kmm/internal/certs"
)

func TestStripNodeKeepsWhatKMMReads(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "t", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Images:     []corev1.ContainerImage{{Names: []string{"registry/image:1"}, SizeBytes: 1}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			NodeInfo:   corev1.NodeSystemInfo{KernelVersion: "6.1.0", BootID: "boot"},
		},
	}
	out, err := stripNode(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if got.ManagedFields != nil || got.Status.Images != nil {
		t.Errorf("managedFields %v and images %v were kept", got.ManagedFields, got.Status.Images)
	}
	if got.Labels["a"] != "b" || !got.Spec.Unschedulable || len(got.Spec.Taints) != 1 || len(got.Status.Conditions) != 1 ||
		got.Status.NodeInfo.KernelVersion != "6.1.0" || got.Status.NodeInfo.BootID != "boot" {
		t.Errorf("stripNode dropped what kmm reads: %+v", got)
	}
	if other, err := stripNode(&corev1.Pod{}); err != nil || other == nil {
		t.Errorf("a non-Node object: %v, %v", other, err)
	}
}

type runnable struct {
	started chan struct{}
	le      *bool
}

func (r runnable) Start(context.Context) error { close(r.started); return nil }

type leRunnable struct{ runnable }

func (r leRunnable) NeedLeaderElection() bool { return *r.le }

// TestGatedRunnableWaitsForTheGate checks that a controller set up through gatedManager starts only
// once the gate opens, keeps its leader election need, and returns when stopped before it.
func TestGatedRunnableWaitsForTheGate(t *testing.T) {
	gate := make(chan struct{})
	r := runnable{started: make(chan struct{})}
	g := gatedRunnable{Runnable: r, gate: gate}
	done := make(chan error, 1)
	go func() { done <- g.Start(context.Background()) }()
	select {
	case <-r.started:
		t.Fatal("started before the gate opened")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	<-r.started
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !g.NeedLeaderElection() {
		t.Error("a runnable that does not say needs leader election")
	}
	no := false
	if (gatedRunnable{Runnable: leRunnable{runnable{le: &no}}}).NeedLeaderElection() {
		t.Error("the runnable's own answer was not kept")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	waiting := runnable{started: make(chan struct{})}
	if err := (gatedRunnable{Runnable: waiting, gate: make(chan struct{})}).Start(ctx); err != nil {
		t.Fatalf("stopped before the gate: %v", err)
	}
	select {
	case <-waiting.started:
		t.Fatal("started although stopped before the gate opened")
	default:
	}
}

func TestWorkerRegistryFlags(t *testing.T) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	o.BindFlags(fs)
	err := fs.Parse([]string{"--worker-containerd-config-path", "/etc/containerd/certs.d", "--worker-certs-dirs", "/etc/docker/certs.d,/etc/containers/certs.d",
		"--worker-ca-bundle-configmap", "kmm-ca", "--worker-credential-provider-config", "/etc/kubernetes/cp.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	r := o.WorkerRegistry
	if r.ContainerdConfigPath != "/etc/containerd/certs.d" || len(r.CertsDirs) != 2 || r.CertsDirs[1] != "/etc/containers/certs.d" || r.CABundleConfigMap != "kmm-ca" {
		t.Errorf("parsed %+v", r)
	}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "credential provider") {
		t.Errorf("a provider config without its bin dir: %v", err)
	}
}

// TestSecretCacheStaysInTheOperatorNamespace checks that the cache holds Secrets of the operator's
// namespace only, whoever manages the certificate: a cached read of another Secret must fail, not
// start a cluster-wide list and watch of Secrets.
func TestSecretCacheStaysInTheOperatorNamespace(t *testing.T) {
	for _, mode := range []string{certs.ModeSelf, certs.ModeNone} {
		o := DefaultOptions()
		o.CertManagement = mode
		opts := cacheOptions(o, o.certOptions())
		var found bool
		for obj, by := range opts.ByObject {
			if _, ok := obj.(*corev1.Secret); !ok {
				continue
			}
			found = true
			if len(by.Namespaces) != 1 {
				t.Errorf("--cert-management=%s: Secrets cached in %v, want only %s", mode, by.Namespaces, o.Certs.Namespace)
			}
			if _, ok := by.Namespaces[o.Certs.Namespace]; !ok {
				t.Errorf("--cert-management=%s: Secrets cached in %v, want only %s", mode, by.Namespaces, o.Certs.Namespace)
			}
		}
		if !found {
			t.Errorf("--cert-management=%s: the cache would hold Secrets of every namespace", mode)
		}
	}
}
