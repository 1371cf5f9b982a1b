package upgrade_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestRolloutPausesAtFailureBudget is the failure budget on a real API server: three nodes at v1,
// maxUnavailable 1, maxFailed 1; v2's load fails on the first node. The rollout pauses with that
// node UpgradeFailed (ImagePull), says so in status.rollout and one RolloutPaused Event, and starts
// no other node; once the load works again the node upgrades but the rollout stays paused until the
// user resumes it (the rollout-resume annotation); then every node ends Loaded v2.
func TestRolloutPausesAtFailureBudget(t *testing.T) {
	one := intstr.FromInt32(1)
	tb, m := loadedAtV1(t, 3, &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one, MaxFailed: &one}, false)
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

	st := waitRollout(t, tb.NS, "paused at the budget with the node failed", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.Paused != nil && st.Paused.Reason == kmmv1beta1.ReasonFailureBudgetExceeded
	})
	if st.NodesByUpgradeState[kmmv1beta1.UpgradeFailed] != 1 || len(st.Nodes) == 0 || st.Nodes[0].Name != bad ||
		st.Nodes[0].State != kmmv1beta1.UpgradeFailed || st.Nodes[0].Reason != string(contract.ReasonImagePull) {
		t.Fatalf("status.rollout %+v: want %s UpgradeFailed (ImagePull) listed first", st, bad)
	}
	if !strings.Contains(st.Paused.Message, bad+" (ImagePull)") || !strings.Contains(st.Paused.Message, "maxFailed is 1") {
		t.Fatalf("pause message %q names neither the node nor the budget", st.Paused.Message)
	}
	assertLabels(t, label, map[string]string{bad: "v2", tb.Nodes[1]: "v1", tb.Nodes[2]: "v1"})

	node.SetOutcome(nil)
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", bad)
	st = waitRollout(t, tb.NS, "the failed node upgraded, still paused", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.NodesByUpgradeState[kmmv1beta1.Upgraded] == 1
	})
	if st.Paused == nil || st.Paused.Reason != kmmv1beta1.ReasonFailureBudgetExceeded {
		t.Fatalf("the rollout went on without the user: %+v", st)
	}
	assertLabels(t, label, map[string]string{tb.Nodes[1]: "v1", tb.Nodes[2]: "v1"})

	setAnnotation(t, tb.NS, "nic", kmmv1beta1.RolloutResumeAnnotation, time.Now().UTC().Format(time.RFC3339Nano))
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", tb.Nodes...)
	waitRollout(t, tb.NS, "every node upgraded, not paused", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.Paused == nil && st.NodesByUpgradeState[kmmv1beta1.Upgraded] == 3
	})
	cluster.AssertEvents(t, tb.NS, "RolloutResumed", string(kmmv1beta1.UpgradeFailed))
	if n := countEvents(t, tb.NS, "RolloutPaused"); n != 1 {
		t.Fatalf("%d RolloutPaused Events, want exactly 1", n)
	}
}

// waitRollout waits until the Module nic's status.rollout satisfies ok and returns it.
func waitRollout(t *testing.T, ns, what string, ok func(*kmmv1beta1.RolloutStatus) bool) *kmmv1beta1.RolloutStatus {
	t.Helper()
	var st *kmmv1beta1.RolloutStatus
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		m := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "nic"}, m); err != nil {
			return false, err.Error()
		}
		st = m.Status.Rollout
		return st != nil && ok(st), fmt.Sprintf("status.rollout %+v: want %s", st, what)
	})
	return st
}

// assertLabels checks the version-module label of each node.
func assertLabels(t *testing.T, key string, want map[string]string) {
	t.Helper()
	for n, v := range want {
		if got := cluster.Node(t, n).Labels[key]; got != v {
			t.Fatalf("version-module label of %s is %q, want %q", n, got, v)
		}
	}
}

// setAnnotation sets an annotation of a Module, as kubectl kmm rollout resume does.
func setAnnotation(t *testing.T, ns, name, key, value string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
			return err
		}
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[key] = value
		return k8s.Update(context.Background(), m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// countEvents counts the namespace's Events with a reason (a series counts once per Event object,
// with its repetitions).
func countEvents(t *testing.T, ns, reason string) int {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Reason == reason {
			n++
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	return n
}
