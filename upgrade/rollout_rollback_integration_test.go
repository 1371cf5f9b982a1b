package upgrade_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
)

// TestRolloutRollsBackFailedNodes is upgradePolicy.rollbackFailed on a real API server: three
// nodes at v1, maxUnavailable 1, maxFailed 1; v2's load fails on the first node. The rollout
// pauses at its budget and sends that node back: its pair loads v1's image again (the Module now
// holds only v2's mappings: v1's config comes from status.rollout.previous), it is RolledBack, the
// other nodes stay at v1, one RollbackStarted Event. Once the load works and the user resumes, the
// rollback ends and every node ends Loaded v2.
func TestRolloutRollsBackFailedNodes(t *testing.T) {
	one := intstr.FromInt32(1)
	tb, m := loadedAtV1(t, 3, &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one, MaxFailed: &one, RollbackFailed: true}, false)
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")

	bad := tb.Nodes[0]
	node.SetOutcome(func(in agent.RunInput) agent.Verdict {
		if in.Node == bad && in.Action == contract.ActionLoad && strings.HasSuffix(in.Config.Config.ContainerImage, ":v2") {
			return agent.Failed(contract.ReasonImagePull, "pulling reg.example.com/nic:v2: manifest unknown")
		}
		return agent.DefaultOutcome(in)
	})
	t.Cleanup(func() { node.SetOutcome(nil) })
	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")

	st := waitRollout(t, tb.NS, "paused, the failed node rolled back", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.Paused != nil && st.NodesByUpgradeState[kmmv1beta1.RolledBack] == 1
	})
	if rb := st.Rollback; rb == nil || rb.Reason != kmmv1beta1.ReasonRollbackFailedNodes || rb.Version != "v1" || len(rb.Nodes) != 1 || rb.Nodes[0] != bad {
		t.Fatalf("status.rollout.rollback %+v: want FailedNodes [%s] to v1", st.Rollback, bad)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", tb.Nodes...)
	assertLabels(t, label, map[string]string{bad: "v1", tb.Nodes[1]: "v1", tb.Nodes[2]: "v1"})
	assertUnloadedBetween(t, bad, tb.NS)
	if n := countEvents(t, tb.NS, "RollbackStarted"); n != 1 {
		t.Fatalf("%d RollbackStarted Events, want 1", n)
	}

	node.SetOutcome(nil)
	setAnnotation(t, tb.NS, "nic", kmmv1beta1.RolloutResumeAnnotation, time.Now().UTC().Format(time.RFC3339Nano))
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", tb.Nodes...)
	waitRollout(t, tb.NS, "every node upgraded, no rollback", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.Paused == nil && st.Rollback == nil && st.NodesByUpgradeState[kmmv1beta1.Upgraded] == 3
	})
}

// assertUnloadedBetween checks that the node's pair never went from Loaded (v2 or v1) straight to
// a load: every load after the first went through an unload (or a failed load, nothing loaded).
func assertUnloadedBetween(t *testing.T, nodeName, ns string) {
	t.Helper()
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: nodeName}, nmc); err != nil {
		t.Fatal(err)
	}
	e := nmc.StatusEntry(ns, "nic")
	if e == nil {
		t.Fatalf("node %s has no pair", nodeName)
	}
	for _, tr := range e.Transitions {
		if tr.From == kmmv1beta1.StateLoaded && tr.To == kmmv1beta1.StateLoading {
			t.Fatalf("node %s loaded straight from Loaded: %+v", nodeName, e.Transitions)
		}
	}
}

// TestRolloutCanarySoaks is upgradePolicy.canary on a real API server: three nodes at v1,
// maxUnavailable 3, one canary (the first node by name) soaking 8 s. The canary moves alone; the
// other two stay labelled v1 while it soaks (CanaryWaiting), and start only once it has run v2
// for 8 s; then every node ends Loaded v2.
func TestRolloutCanarySoaks(t *testing.T) {
	three := intstr.FromInt32(3)
	const soak = 8 * time.Second
	tb, m := loadedAtV1(t, 3, &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &three,
		Canary: &kmmv1beta1.CanarySpec{Count: 1, SoakSeconds: int32(soak / time.Second)}}, false)
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")

	canary := tb.Nodes[0]
	st := waitRollout(t, tb.NS, "the canary soaking", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.Version == "v2" && st.Canary != nil && st.Canary.SoakStart != nil
	})
	if len(st.Canary.Nodes) != 1 || st.Canary.Nodes[0] != canary || st.Canary.Passed || st.NodesByUpgradeState[kmmv1beta1.CanaryWaiting] != 2 {
		t.Fatalf("status.rollout %+v (canary %+v): want %s soaking and two CanaryWaiting", st, st.Canary, canary)
	}
	assertLabels(t, label, map[string]string{canary: "v2", tb.Nodes[1]: "v1", tb.Nodes[2]: "v1"})
	soakEnds := st.Canary.SoakStart.Add(soak)

	tb.WaitLoaded("nic", "reg.example.com/nic:v2", tb.Nodes...)
	waitRollout(t, tb.NS, "every node upgraded, the canary passed", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.NodesByUpgradeState[kmmv1beta1.Upgraded] == 3 && st.Canary != nil && st.Canary.Passed
	})
	// The others left v1 (their first transition after the bump) no earlier than the soak's end.
	for _, n := range tb.Nodes[1:] {
		nmc := &kmmv1beta1.NodeModulesConfig{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Name: n}, nmc); err != nil {
			t.Fatal(err)
		}
		for _, tr := range nmc.StatusEntry(tb.NS, "nic").Transitions {
			if tr.From == kmmv1beta1.StateLoaded && tr.To != kmmv1beta1.StateLoaded && tr.Time.Time.Before(soakEnds) {
				t.Fatalf("node %s left Loaded v1 at %s, before the canary's soak ended at %s", n, tr.Time, soakEnds)
			}
		}
	}
}
