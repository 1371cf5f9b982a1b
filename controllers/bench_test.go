package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// BenchmarkNoOpReconcile10Modules is the in-memory part of a no-op NMC reconcile of a node with
// ten Loaded modules: the per-pair facts, fsm.Step for each pair, the status comparison and the
// label comparison, ending in no write (a write would panic: the reconciler has no client). It
// leaves out the cache reads (a Get of the NMC and the Node, a List of the node's pods and of the
// Modules), which the scale harness's CPU per reconcile includes.
func BenchmarkNoOpReconcile10Modules(b *testing.B) {
	const kernel, boot = "6.1.0-56-cloud-amd64", "b1"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := metav1.NewTime(t0.Add(-time.Minute))
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}}}
	node.Status.NodeInfo = corev1.NodeSystemInfo{KernelVersion: kernel, BootID: boot}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastTransitionTime: metav1.NewTime(t0.Add(-time.Hour))}}
	modules := map[string]bool{}
	for i := range 10 {
		name := fmt.Sprintf("m%d", i)
		cfg := kmmv1beta1.ModuleConfig{KernelVersion: kernel, ContainerImage: "r/" + name + ":v1",
			Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: name}}
		nmc.Spec.Modules = append(nmc.Spec.Modules, kmmv1beta1.NodeModuleSpec{Namespace: "ns", Name: name, Config: cfg})
		nmc.Status.Modules = append(nmc.Status.Modules, kmmv1beta1.NodeModuleStatus{Namespace: "ns", Name: name,
			State: kmmv1beta1.StateLoaded, Config: cfg.DeepCopy(), BootID: boot, LastWorkerTime: &at, LastTransitionTime: at})
		node.Labels[kmmv1beta1.ReadyLabel("ns", name)] = ""
		modules["ns/"+name] = true
	}
	r := &NMCReconciler{BackOff: fsm.DefaultBackOff}
	ctx, log := context.Background(), logr.Discard()
	b.ReportAllocs()
	for b.Loop() {
		f := &nodeFacts{nmc: nmc, node: node, workers: map[string]*corev1.Pod{}, dpRunning: map[string]bool{},
			modulesSet: modules, drains: map[string]*kmmv1beta1.DrainSpec{}}
		outcomes, err := r.decide(ctx, f, t0, log)
		if err != nil {
			b.Fatal(err)
		}
		for _, o := range outcomes {
			if len(o.result.Fired) != 0 {
				b.Fatal(o.key, o.result.Fired)
			}
		}
		if err := r.writeStatus(ctx, f.nmc, outcomes); err != nil {
			b.Fatal(err)
		}
		if err := r.patchLabels(ctx, f, outcomes); err != nil {
			b.Fatal(err)
		}
		if d := requeueAfter(outcomes); d != 0 {
			b.Fatal(d)
		}
	}
}
