package agent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

func TestEventsAreCollectedForTheNextPass(t *testing.T) {
	a := &Agent{wake: make(chan struct{}, 1)}
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}}
	}
	pods, nodes := a.podHandler(), a.nodeHandler()
	pods.OnAdd(pod("a", "1"), false)
	pods.OnUpdate(pod("b", "2"), pod("b", "2"))
	pods.OnDelete(pod("c", "3"))
	pods.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "ns/d", Obj: pod("d", "4")})
	nodes.OnUpdate(&corev1.Node{}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	a.changes.wake("n2")
	select {
	case <-a.wake:
	default:
		t.Error("the events did not wake the loop")
	}

	p := a.changes.take()
	if p.full || len(p.pods) != 4 || len(p.gone) != 2 || p.gone[0] != "3" || p.gone[1] != "4" {
		t.Errorf("pending = %+v, want pods a-d and gone 3, 4", p)
	}
	if _, ok := p.nodes["n1"]; !ok || len(p.nodes) != 1 {
		t.Errorf("nodes = %v, want n1", p.nodes)
	}
	if _, ok := p.woken["n2"]; !ok || len(p.woken) != 1 {
		t.Errorf("woken = %v, want n2", p.woken)
	}
	if p := a.changes.take(); p.full || p.pods != nil || p.gone != nil || p.nodes != nil || p.woken != nil {
		t.Errorf("a second take = %+v, want nothing", p)
	}

	pods.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "ns/e"})
	if p := a.changes.take(); !p.full {
		t.Errorf("a tombstone without a pod: pending = %+v, want a full pass", p)
	}
}

func TestRemovedByAPIServer(t *testing.T) {
	zero, thirty := int64(0), int64(30)
	pod := func(phase corev1.PodPhase, grace *int64, finalizers ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionGracePeriodSeconds: grace, Finalizers: finalizers}}
		p.Status.Phase = phase
		return p
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"ended, grace 0", pod(corev1.PodSucceeded, &zero), true},
		{"failed, grace 0", pod(corev1.PodFailed, &zero), true},
		{"running", pod(corev1.PodRunning, &thirty), false},
		{"ended with a finalizer", pod(corev1.PodSucceeded, &zero, "example.com/stuck"), false},
		{"ended, not deleted", pod(corev1.PodSucceeded, nil), false},
	}
	for _, tt := range tests {
		if got := removedByAPIServer(tt.pod); got != tt.want {
			t.Errorf("%s: removedByAPIServer = %v, want %v", tt.name, got, tt.want)
		}
	}
}
