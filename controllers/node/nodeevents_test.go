package node

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// TestNodeEventsDropOnlyWhatTheControllerDoesNotRead: a kubelet's status post (heartbeat times,
// images, capacity, a pressure condition) queues no reconcile; a change of anything the NMC
// controller reads does, and so do resyncs.
func TestNodeEventsDropOnlyWhatTheControllerDoesNotRead(t *testing.T) {
	since := metav1.NewTime(time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC))
	base := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "10", Labels: map[string]string{"kmm.node.kubernetes.io/drivers.nic.ready": ""}},
		Status: corev1.NodeStatus{
			NodeInfo:   corev1.NodeSystemInfo{KernelVersion: "6.1.0", BootID: "b1"},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: since, LastHeartbeatTime: since}},
		},
	}
	cases := map[string]struct {
		change func(n *corev1.Node)
		want   bool
	}{
		"heartbeat": {func(n *corev1.Node) {
			n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(since.Add(time.Minute))
			n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry.example/app:v1"}, SizeBytes: 1}}
			n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue})
			n.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeDiskPressure, Effect: corev1.TaintEffectNoSchedule}}
		}, false},
		"resync":      {func(n *corev1.Node) { n.ResourceVersion = "10" }, true},
		"label added": {func(n *corev1.Node) { n.Labels["kmm.node.kubernetes.io/drivers.gpu.ready"] = "" }, true},
		"label gone":  {func(n *corev1.Node) { n.Labels = nil }, true},
		"kernel":      {func(n *corev1.Node) { n.Status.NodeInfo.KernelVersion = "6.2.0" }, true},
		"reboot":      {func(n *corev1.Node) { n.Status.NodeInfo.BootID = "b2" }, true},
		"not ready":   {func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		"ready again": {func(n *corev1.Node) {
			n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(since.Add(time.Second))
		}, true},
		"cordoned":     {func(n *corev1.Node) { n.Spec.Unschedulable = true }, true},
		"being delete": {func(n *corev1.Node) { n.DeletionTimestamp = &since }, true},
	}
	p := nodeEvents()
	for name, c := range cases {
		n := base.DeepCopy()
		n.ResourceVersion = "11"
		c.change(n)
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != c.want {
			t.Errorf("%s: queued %v, want %v", name, got, c.want)
		}
	}
	if !p.Create(event.CreateEvent{Object: base}) || !p.Delete(event.DeleteEvent{Object: base}) {
		t.Error("a Node's creation and deletion must queue its NMC")
	}
}
