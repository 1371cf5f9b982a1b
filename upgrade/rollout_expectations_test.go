package upgrade

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRolloutTrustsItsOwnLabelsOverAStaleCache: a node whose version-module label the rollout set
// counts with that label until the cache shows it (or the expectation expires), so the next plan
// does not start more nodes than maxUnavailable allows.
func TestRolloutTrustsItsOwnLabelsOverAStaleCache(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	r := &RolloutReconciler{Clock: clk}
	const key = "kmm.node.kubernetes.io/version-module.ns.m"
	stale := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{key: "v1", "other": "x"}}}

	r.expected().Expect(nodeLabel{node: "a", key: key}, "v2", clk.Now())
	if got := r.withExpectedLabel(stale, key); got[key] != "v2" || got["other"] != "x" {
		t.Fatalf("labels over a stale cache = %v, want %s=v2 and the other labels", got, key)
	}
	if stale.Labels[key] != "v1" {
		t.Fatal("the cached node's labels were modified")
	}

	fresh := stale.DeepCopy()
	fresh.Labels[key] = "v2"
	r.withExpectedLabel(fresh, key)
	if r.expected().Len() != 0 {
		t.Fatal("the expectation outlived the cache showing the label")
	}

	r.expected().Expect(nodeLabel{node: "a", key: key}, "v3", clk.Now())
	clk.SetTime(clk.Now().Add(labelExpectationTTL + time.Second))
	if got := r.withExpectedLabel(stale, key); got[key] != "v1" {
		t.Fatalf("an expired expectation still overrides the cache: %v", got)
	}
}
