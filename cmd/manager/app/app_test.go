package app

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
