package module

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSweepOrder: every Module reconcile applies its entries in the order of the node names, so
// that Modules reconciled side by side reach a node at about the same time (the cache lists nodes
// in no order), and all of them share one set of SpecWriters slots.
func TestSweepOrder(t *testing.T) {
	nodes := []corev1.Node{}
	for _, n := range []string{"n2", "n10", "n1", "a", "n3"} {
		nodes = append(nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	var got []string
	for _, i := range byName(nodes) {
		got = append(got, nodes[i].Name)
	}
	if want := []string{"a", "n1", "n10", "n2", "n3"}; !slices.Equal(got, want) {
		t.Errorf("applied in the order %v, want %v", got, want)
	}
	r := &Reconciler{}
	if a, b := r.writers(), r.writers(); a != b || cap(a) != SpecWriters {
		t.Errorf("the Module reconciles' apply slots: one channel of %d shared by all, got %d and %d slots (shared: %t)", SpecWriters, cap(a), cap(b), a == b)
	}
}
