package controllers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestFinalizerLeavesTheSpecAsWritten: the finalizer comes by a patch of metadata.finalizers, so the
// spec the user applied (explicit defaults such as insecure: false included) is stored byte for byte
// and the generation stays 1; an Update of the Go object used to drop insecure: false, add
// registryTLS: {} and bump the generation, which GitOps tools report as drift.
func TestFinalizerLeavesTheSpecAsWritten(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	typed := tb.Module("asis")
	u := &unstructured.Unstructured{}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		t.Fatal(err)
	}
	u.Object = obj
	u.SetAPIVersion(kmmv1beta1.GroupVersion.String())
	u.SetKind("Module")
	container := map[string]any{"insecure": false, "insecureSkipTLSVerify": false}
	if err := unstructured.SetNestedField(u.Object, container, "spec", "moduleLoader", "container", "registryTLS"); err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	tb.Create(u)
	sent, _, _ := unstructured.NestedMap(u.Object, "spec")

	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(kmmv1beta1.GroupVersion.WithKind("Module"))
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "asis"}, got); err != nil {
			return false, err.Error()
		}
		if len(got.GetFinalizers()) == 0 {
			return false, "no finalizer yet"
		}
		stored, _, _ := unstructured.NestedMap(got.Object, "spec")
		if got.GetGeneration() != 1 || !equality.Semantic.DeepEqual(stored, sent) {
			t.Fatalf("after the finalizer: generation %d, spec\n  %v\nwant generation 1 and the spec as sent\n  %v", got.GetGeneration(), stored, sent)
		}
		return true, ""
	})
}

// TestUsersLabelThatEndsInReadyStays: a node label kmm did not derive — here the upgrade-skip label
// of a Module named gpu.ready, which ends in ".ready" — survives the NMC controller's label updates
// (it used to be removed as if it were a ready label).
func TestUsersLabelThatEndsInReadyStays(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	node := tb.Nodes[0]
	userLabel := kmmv1beta1.UpgradeSkipLabel(tb.NS, "gpu.ready")
	cluster.SetNodeLabel(t, node, userLabel, "yes")
	tb.Create(tb.Module("other"))
	tb.WaitLoaded("other", "reg.example.com/other:a", node)
	if _, ok := cluster.Node(t, node).Labels[userLabel]; !ok {
		t.Fatalf("the user's label %s was removed from %s", userLabel, node)
	}
}

// TestReadyOnlyOnceLoaded watches a new Module's conditions from its first status write: Ready is
// never True before the module is loaded on its nodes (it used to read "loaded on 0 of 0 nodes"
// while the cache lagged the operator's own spec writes).
func TestReadyOnlyOnceLoaded(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	var (
		mu     sync.Mutex
		early  []string
		seenOK bool
	)
	testbed.Watch(t, cluster, &kmmv1beta1.ModuleList{}, func(_ watch.EventType, m *kmmv1beta1.Module) {
		if m.Name != "fresh" {
			return
		}
		ready := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionReady)
		if ready == nil || ready.Status != "True" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		seenOK = true
		if m.Status.ModuleLoader.AvailableNumber < 3 || m.Status.ModuleLoader.DesiredNumber < 3 {
			early = append(early, fmt.Sprintf("Ready=True with %q (available %d, desired %d)", ready.Message,
				m.Status.ModuleLoader.AvailableNumber, m.Status.ModuleLoader.DesiredNumber))
		}
	}, client.InNamespace(tb.NS))
	tb.Create(tb.Module("fresh"))
	tb.WaitLoaded("fresh", "reg.example.com/fresh:a", tb.Nodes...)
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return seenOK, "Ready=True never seen"
	})
	mu.Lock()
	defer mu.Unlock()
	if len(early) > 0 {
		t.Fatalf("Ready before the module was loaded: %v", early)
	}
}

// TestDevicePluginOnlyModule: a Module without moduleLoader (upstream allows it) loads nothing and
// runs its device plugin on every selected node; its DaemonSet selects the Module's selector and
// kube-controller-manager runs its pods there.
func TestDevicePluginOnlyModule(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	m := tb.Module("plugin-only")
	m.Spec.ModuleLoader = nil
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:1"}}
	tb.Create(m)

	ds := &appsv1.DaemonSet{}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: module.DevicePluginName(m)}, ds); err != nil {
			return false, err.Error()
		}
		return ds.Status.NumberAvailable == 2, fmt.Sprintf("device plugin DaemonSet status %+v", ds.Status)
	})
	if sel := ds.Spec.Template.Spec.NodeSelector; len(sel) != 1 || sel[tb.Label] != "yes" {
		t.Fatalf("device plugin DaemonSet selects %v, want the Module's selector", sel)
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			return false, err.Error()
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionReady)
		return ready != nil && ready.Status == "True" && got.Status.DevicePlugin.AvailableNumber == 2,
			fmt.Sprintf("status %+v conditions %+v", got.Status.DevicePlugin, got.Status.Conditions)
	})
	for _, n := range tb.Nodes {
		if st := cluster.PairStatus(n, tb.NS, "plugin-only"); st != nil {
			t.Fatalf("a device-plugin-only Module has a pair on %s: %s", n, testbed.Describe(st))
		}
		if pods := workerPodsOn(t, n); len(pods) != 0 {
			t.Fatalf("worker pods on %s for a device-plugin-only Module: %d", n, len(pods))
		}
	}
}
