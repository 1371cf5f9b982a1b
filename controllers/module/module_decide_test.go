package module

import (
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// TestModuleDecide checks the pure step of the Module reconcile: an invalid Module is reported (and
// act then leaves its nodes alone), a deleted one is unloaded whatever it says, and every node gets
// a spec decision either way.
func TestModuleDecide(t *testing.T) {
	valid := func() *kmmv1beta1.Module {
		m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}
		m.Spec.Selector = map[string]string{"gpu": "yes"}
		m.Spec.ModuleLoader = &kmmv1beta1.ModuleLoaderSpec{}
		c := &m.Spec.ModuleLoader.Container
		c.Modprobe.ModuleName = "mod"
		c.KernelMappings = []kmmv1beta1.KernelMapping{{Literal: "6.1.0", ContainerImage: "registry.local/mod:6.1.0"}}
		return m
	}
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"gpu": "yes"}}}
	node.Status.NodeInfo.KernelVersion = "6.1.0"
	invalid := valid()
	invalid.Spec.ModuleLoader.Container.KernelMappings[0].Regexp = "("
	deleted := invalid.DeepCopy()
	deleted.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	deleted.Finalizers = []string{Finalizer}

	for _, tc := range []struct {
		name        string
		module      *kmmv1beta1.Module
		wantInvalid bool
		wantAction  fsm.SpecAction
	}{
		{"valid", valid(), false, fsm.SpecUpdate},
		{"invalid", invalid, true, fsm.SpecUpdate},
		{"invalid but deleted", deleted, false, fsm.SpecDelete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &moduleScope{module: tc.module, nodes: []corev1.Node{node}, decisions: map[string]fsm.SpecDecision{}}
			s.decide()
			if (s.invalid != "") != tc.wantInvalid {
				t.Errorf("invalid = %q, want invalid: %v", s.invalid, tc.wantInvalid)
			}
			if d, ok := s.decisions["n1"]; !ok || d.Action != tc.wantAction {
				t.Errorf("decision for n1 = %+v (present %v), want action %v", d, ok, tc.wantAction)
			}
		})
	}
}

// TestModuleStatusCountsFromDecisions: a Module just created, whose spec entries the cache does not
// show yet, is not Ready ("loaded on 0 of 1 nodes", not "0 of 0"); and a generation whose writes
// failed is not stamped as observed.
func TestModuleStatusCountsFromDecisions(t *testing.T) {
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Generation: 2}}
	m.Status.ObservedGeneration = 1
	m.Spec.Selector = map[string]string{"gpu": "yes"}
	m.Spec.ModuleLoader = &kmmv1beta1.ModuleLoaderSpec{}
	c := &m.Spec.ModuleLoader.Container
	c.Modprobe.ModuleName = "mod"
	c.KernelMappings = []kmmv1beta1.KernelMapping{{Literal: "6.1.0", ContainerImage: "registry.local/mod:6.1.0"}}
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"gpu": "yes"}}}
	node.Status.NodeInfo.KernelVersion = "6.1.0"
	now := metav1.NewTime(time.Unix(100, 0))

	s := &moduleScope{module: m, nodes: []corev1.Node{node}, nmcs: map[string]*kmmv1beta1.NodeModulesConfig{}, decisions: map[string]fsm.SpecDecision{}}
	s.decide()
	st := computeModuleStatus(s, nil, now)
	if st.ModuleLoader.DesiredNumber != 1 || st.ModuleLoader.AvailableNumber != 0 {
		t.Fatalf("desired/available = %d/%d before the cache shows the spec entry, want 1/0", st.ModuleLoader.DesiredNumber, st.ModuleLoader.AvailableNumber)
	}
	if ready := meta.FindStatusCondition(st.Conditions, kmmv1beta1.ConditionReady); ready == nil || ready.Status != metav1.ConditionFalse {
		t.Fatalf("Ready = %+v before anything is loaded", ready)
	}
	if st.ObservedGeneration != 1 {
		t.Fatalf("observedGeneration = %d after a reconcile that was not fully acted on, want the previous 1", st.ObservedGeneration)
	}

	// Loaded with the decided config: available, Ready, and the generation is observed.
	s.actedOn = true
	s.nmcs["n1"] = &kmmv1beta1.NodeModulesConfig{Status: kmmv1beta1.NodeModulesConfigStatus{Modules: []kmmv1beta1.NodeModuleStatus{{
		Namespace: "ns", Name: "m", State: kmmv1beta1.StateLoaded, Config: s.decisions["n1"].Entry.Config.DeepCopy(),
	}}}}
	st = computeModuleStatus(s, nil, now)
	if st.ModuleLoader.AvailableNumber != 1 || st.ObservedGeneration != 2 {
		t.Fatalf("available = %d, observedGeneration = %d; want 1 and 2", st.ModuleLoader.AvailableNumber, st.ObservedGeneration)
	}
	if ready := meta.FindStatusCondition(st.Conditions, kmmv1beta1.ConditionReady); ready == nil || ready.Status != metav1.ConditionTrue || ready.ObservedGeneration != 2 {
		t.Fatalf("Ready = %+v once loaded", ready)
	}
}

// TestNodeChangeRequests: which Modules a Node event queues. The ready, version.ready and
// device-plugin-ready labels the NMC controller sets as a pair loads queue none (the ready label did
// before issue 22, the other two before issue 35: every selecting Module, for every pair), but a
// Module whose selector names one; selector and version labels still queue the Modules selecting
// the node.
func TestNodeChangeRequests(t *testing.T) {
	module := func(name string, sel map[string]string, deleting bool) kmmv1beta1.Module {
		m := kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: kmmv1beta1.ModuleSpec{Selector: sel}}
		if deleting {
			m.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		}
		return m
	}
	nicReady := kmmv1beta1.ReadyLabel("ns", "nic")
	modules := []kmmv1beta1.Module{
		module("nic", map[string]string{"gpu": "yes"}, false),
		module("after-nic", map[string]string{nicReady: ""}, false),
		module("other", map[string]string{"role": "storage"}, false),
		module("gone", map[string]string{"role": "storage"}, true),
	}
	base := map[string]string{"gpu": "yes"}
	with := func(k, v string) map[string]string {
		l := maps.Clone(base)
		l[k] = v
		return l
	}
	tests := []struct {
		name      string
		old, next map[string]string
		kernel    bool
		want      []string
	}{
		{"a new node", nil, base, false, []string{"nic", "gone"}},
		{"nic's ready label set: only the Module selecting on it", base, with(nicReady, ""), false, []string{"after-nic", "gone"}},
		{"a user label changed", base, with("zone", "b"), false, []string{"nic", "gone"}},
		{"the kernel changed", base, base, true, []string{"nic", "gone"}},
		{"deselected", base, map[string]string{}, false, []string{"nic", "gone"}},
		{"a version label changed", base, with(kmmv1beta1.WorkerPodVersionLabel("ns", "nic"), "v2"), false, []string{"nic", "gone"}},
		{"nic's version.ready label set: none", base, with(kmmv1beta1.VersionReadyLabel("ns", "nic"), "v1"), false, []string{"gone"}},
		{"nic's device-plugin-ready label set: none", base, with(kmmv1beta1.DevicePluginReadyLabel("ns", "nic"), ""), false, []string{"gone"}},
		{"nic's ready label removed: only the Module selecting on it", with(nicReady, ""), base, false, []string{"after-nic", "gone"}},
		{"the device plugin version label changed", base, with(kmmv1beta1.DevicePluginVersionLabel("ns", "nic"), "v2"), false, []string{"nic", "gone"}},
		{"the user's version-module label changed", base, with(kmmv1beta1.ModuleVersionLabel("ns", "nic"), "v2"), false, []string{"nic", "gone"}},
		{"a ready label of no Module is a user's label", base, with(kmmv1beta1.ReadyLabel("ns", "unknown"), ""), false, []string{"nic", "gone"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, r := range nodeChangeRequests(modules, tt.old, tt.next, tt.kernel) {
				got = append(got, r.Name)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("queued %v, want %v", got, tt.want)
			}
		})
	}
}
