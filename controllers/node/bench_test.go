package node

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// BenchmarkNoOpReconcile10Modules is the in-memory part of a no-op NMC reconcile of a node with
// ten Loaded modules: the per-pair facts, fsm.Step for each pair, the status comparison and the
// label comparison, ending in no write (a write would panic: the reconciler has no client). It
// leaves out the cache reads (a Get of the NMC and the Node, a List of the node's pods and of the
// Modules), which the scale harness's CPU per reconcile includes.
func BenchmarkNoOpReconcile10Modules(b *testing.B) {
	nmc, node, modules, t0 := noOpFixture()
	modulesSet := map[string]bool{}
	for _, m := range modules {
		modulesSet[m.Namespace+"/"+m.Name] = true
	}
	r := &NMCReconciler{BackOff: fsm.DefaultBackOff}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU(b)
	defer cpu.report()
	for b.Loop() {
		f := &nodeFacts{nmc: nmc, node: node, workers: map[string]*corev1.Pod{}, dpRunning: map[string]bool{},
			modulesSet: modulesSet, drains: map[string]*kmmv1beta1.DrainSpec{}}
		d, err := r.decide(ctx, f, t0)
		if err != nil {
			b.Fatal(err)
		}
		for _, o := range d.outcomes {
			if len(o.result.Fired) != 0 {
				b.Fatal(o.key, o.result.Fired)
			}
		}
		if err := r.writeStatus(ctx, f, d); err != nil {
			b.Fatal(err)
		}
		if err := r.patchLabels(ctx, f, d.labels); err != nil {
			b.Fatal(err)
		}
		if d := d.requeueAfter; d != 0 {
			b.Fatal(d)
		}
	}
}

// BenchmarkNoOpReconcileWithReads10Modules is the whole NMC Reconcile of a node with ten Loaded
// modules and nothing to do, reads included: the NMC and the Node are deep-copied as the cache's
// Get does, the Modules listed without a copy as the reconciler asks the cache to. Any write
// panics (memCache embeds a nil client.Client), so a reconcile that writes fails the benchmark.
func BenchmarkNoOpReconcileWithReads10Modules(b *testing.B) {
	nmc, node, modules, t0 := noOpFixture()
	c := &memCache{nmc: nmc, node: node, modules: modules}
	r := &NMCReconciler{Client: c, BackOff: fsm.DefaultBackOff, Clock: clocktesting.NewFakePassiveClock(t0)}
	ctx := logr.NewContext(context.Background(), logr.Discard())
	req := ctrl.Request{NamespacedName: types.NamespacedName{Name: node.Name}}
	b.ReportAllocs()
	cpu := startCPU(b)
	for b.Loop() {
		res, err := r.Reconcile(ctx, req)
		if err != nil || res.RequeueAfter != 0 {
			b.Fatal(res, err)
		}
	}
	cpu.report()
}

// cpuMeter reports the process's CPU time per iteration (user + system, garbage collection on
// other cores included) as cpu-ns/op: SPEC §10's budget is CPU, and ns/op is wall time.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) cpuMeter { return cpuMeter{b: b, start: processCPU(b)} }

func (m cpuMeter) report() {
	m.b.ReportMetric(float64(processCPU(m.b)-m.start)/float64(m.b.N), "cpu-ns/op")
}

// processCPU is the CPU time the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// noOpFixture is a node with ten modules Loaded as its NMC's spec asks, and the time to decide at.
func noOpFixture() (*kmmv1beta1.NodeModulesConfig, *corev1.Node, []kmmv1beta1.Module, time.Time) {
	const kernel, boot = "6.1.0-56-cloud-amd64", "b1"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := metav1.NewTime(t0.Add(-time.Minute))
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}}}
	node.Status.NodeInfo = corev1.NodeSystemInfo{KernelVersion: kernel, BootID: boot}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}}
	var modules []kmmv1beta1.Module
	for i := range 10 {
		name := fmt.Sprintf("m%d", i)
		cfg := kmmv1beta1.ModuleConfig{KernelVersion: kernel, ContainerImage: "r/" + name + ":v1",
			Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: name}}
		nmc.Spec.Modules = append(nmc.Spec.Modules, kmmv1beta1.NodeModuleSpec{Namespace: "ns", Name: name, Config: cfg})
		nmc.Status.Modules = append(nmc.Status.Modules, kmmv1beta1.NodeModuleStatus{Namespace: "ns", Name: name,
			State: kmmv1beta1.StateLoaded, Config: cfg.DeepCopy(), BootID: boot, LastWorkerTime: &at, LastTransitionTime: at})
		node.Labels[kmmv1beta1.ReadyLabel("ns", name)] = ""
		modules = append(modules, kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}})
	}
	return nmc, node, modules, t0
}

// memCache reads as controller-runtime's cache does: Get returns a deep copy unless asked with
// UnsafeDisableDeepCopy, List (always asked so by the reconciler) the stored objects. It leaves out
// the cache's index lookup and label matching. Writes go to the embedded nil client.Client and
// panic.
type memCache struct {
	client.Client
	nmc     *kmmv1beta1.NodeModulesConfig
	node    *corev1.Node
	modules []kmmv1beta1.Module
}

func (c *memCache) Get(_ context.Context, _ client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	var o client.GetOptions
	o.ApplyOptions(opts)
	shared := o.UnsafeDisableDeepCopy != nil && *o.UnsafeDisableDeepCopy
	switch out := obj.(type) {
	case *kmmv1beta1.NodeModulesConfig:
		if shared {
			*out = *c.nmc
		} else {
			c.nmc.DeepCopyInto(out)
		}
	case *corev1.Node:
		if shared {
			*out = *c.node
		} else {
			c.node.DeepCopyInto(out)
		}
	default:
		return fmt.Errorf("unexpected Get of a %T", obj)
	}
	return nil
}

func (c *memCache) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	switch l := list.(type) {
	case *corev1.PodList:
		l.Items = nil
	case *kmmv1beta1.ModuleList:
		l.Items = c.modules
	default:
		return fmt.Errorf("unexpected List of a %T", list)
	}
	return nil
}
