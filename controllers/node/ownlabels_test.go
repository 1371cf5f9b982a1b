package node

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func nodeAt(rv string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: rv}}
}

// TestOverlayLabelPatch: the node a reconcile decides on is the answer of the controller's own last
// label patch while the cache shows a version a remembered patch was decided on, and the cache's
// own node once it shows any other version or the record expired.
func TestOverlayLabelPatch(t *testing.T) {
	now := time.Unix(1000, 0)
	decidedOn := func(r *NMCReconciler, cached string, at time.Time) string {
		f := &nodeFacts{node: nodeAt(cached)}
		r.overlayLabelPatch(f, at)
		return f.node.ResourceVersion
	}
	r := &NMCReconciler{}
	if got := decidedOn(r, "1", now); got != "1" {
		t.Fatalf("no patch yet: decided on %s, want the cache's 1", got)
	}
	r.rememberLabelPatch("1", nodeAt("2"), now)
	if got := decidedOn(r, "1", now); got != "2" {
		t.Fatalf("cache at 1 after a patch 1→2: decided on %s, want 2", got)
	}
	// A second patch decided on the overlay (2): the cache still at 1 or at 2 is behind it.
	r.rememberLabelPatch("2", nodeAt("3"), now)
	for _, cached := range []string{"1", "2"} {
		if got := decidedOn(r, cached, now); got != "3" {
			t.Fatalf("cache at %s after patches 1→2→3: decided on %s, want 3", cached, got)
		}
	}
	if got := decidedOn(r, "3", now); got != "3" {
		t.Fatalf("cache caught up: decided on %s", got)
	}
	if got := decidedOn(r, "1", now); got != "1" || r.ownLabelPatches().Len() != 0 {
		t.Fatalf("a cache that showed another version ends the overlay: decided on %s, %d records", got, r.ownLabelPatches().Len())
	}
	r.rememberLabelPatch("5", nodeAt("6"), now)
	if got := decidedOn(r, "5", now.Add(expectationTTL+time.Second)); got != "5" {
		t.Fatalf("an expired record: decided on %s, want the cache's 5", got)
	}
}

// TestLabelPatchRecordIsBounded: a node patched again and again before its cache shows any of it
// keeps at most maxOlderVersions versions.
func TestLabelPatchRecordIsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	r := &NMCReconciler{}
	for i := range 3 * maxOlderVersions {
		r.rememberLabelPatch(string(rune('a'+i)), nodeAt(string(rune('a'+i+1))), now)
	}
	p, _ := r.ownLabelPatches().Get("n", now)
	if len(p.older) != maxOlderVersions {
		t.Fatalf("%d versions remembered, want %d", len(p.older), maxOlderVersions)
	}
}
