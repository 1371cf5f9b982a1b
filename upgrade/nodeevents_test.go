package upgrade

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// heartbeatPair is a real-looking Node before and after a kubelet's status post: the same labels
// (in maps of their own, as two decoded objects have), new heartbeat times.
func heartbeatPair() (*corev1.Node, *corev1.Node) {
	since := metav1.NewTime(time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC))
	old := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "10", Labels: map[string]string{"kubernetes.io/hostname": "n1",
			"kubernetes.io/os": "linux", corev1.LabelArchStable: "amd64", corev1.LabelInstanceTypeStable: "m6i.4xlarge",
			corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: "region-1a", "node.kubernetes.io/pool": "pool-2",
			"kmm.node.kubernetes.io/drivers.nic.ready": ""}},
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeReady} {
		status := corev1.ConditionFalse
		if c == corev1.NodeReady {
			status = corev1.ConditionTrue
		}
		old.Status.Conditions = append(old.Status.Conditions, corev1.NodeCondition{Type: c, Status: status, LastTransitionTime: since, LastHeartbeatTime: since})
	}
	next := old.DeepCopy()
	next.ResourceVersion = "11"
	for i := range next.Status.Conditions {
		next.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(since.Add(time.Minute))
	}
	return old, next
}

// TestNodePredicatesDropHeartbeats: the rollout and version label controllers queue nothing for
// a kubelet's status post, and still see a change of labels (a value, a new key, a key gone; nil
// and empty label maps are the same), of schedulability and of readiness (rollout).
func TestNodePredicatesDropHeartbeats(t *testing.T) {
	cases := map[string]struct {
		change            func(n *corev1.Node)
		rollout, versions bool
	}{
		"heartbeat":     {func(*corev1.Node) {}, false, false},
		"label value":   {func(n *corev1.Node) { n.Labels["node.kubernetes.io/pool"] = "pool-3" }, true, true},
		"label added":   {func(n *corev1.Node) { n.Labels["kmm.node.kubernetes.io/drivers.gpu.ready"] = "" }, true, true},
		"label gone":    {func(n *corev1.Node) { delete(n.Labels, "kmm.node.kubernetes.io/drivers.nic.ready") }, true, true},
		"cordoned":      {func(n *corev1.Node) { n.Spec.Unschedulable = true }, true, false},
		"not ready":     {func(n *corev1.Node) { n.Status.Conditions[3].Status = corev1.ConditionFalse }, true, false},
		"pressure only": {func(n *corev1.Node) { n.Status.Conditions[1].Status = corev1.ConditionTrue }, false, false},
	}
	rollout, versions := nodeRolloutFactsChanged(), labelsChanged()
	for name, c := range cases {
		old, next := heartbeatPair()
		c.change(next)
		e := event.UpdateEvent{ObjectOld: old, ObjectNew: next}
		if got := rollout.Update(e); got != c.rollout {
			t.Errorf("%s: rollout queued %v, want %v", name, got, c.rollout)
		}
		if got := versions.Update(e); got != c.versions {
			t.Errorf("%s: version labels queued %v, want %v", name, got, c.versions)
		}
	}
	old, next := heartbeatPair()
	old.Labels, next.Labels = nil, map[string]string{}
	if e := (event.UpdateEvent{ObjectOld: old, ObjectNew: next}); rollout.Update(e) || versions.Update(e) {
		t.Error("nil and empty labels are the same labels")
	}
}

// BenchmarkNodeHeartbeatPredicates is what a kubelet's status post costs the rollout and version
// label controllers: their Node update predicates on a heartbeat (issue 41, round six).
func BenchmarkNodeHeartbeatPredicates(b *testing.B) {
	old, next := heartbeatPair()
	e := event.UpdateEvent{ObjectOld: old, ObjectNew: next}
	rollout, versions := nodeRolloutFactsChanged(), labelsChanged()
	b.ReportAllocs()
	for b.Loop() {
		if rollout.Update(e) || versions.Update(e) {
			b.Fatal("a heartbeat was queued")
		}
	}
}
