package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	deleted.Finalizers = []string{ModuleFinalizer}

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
