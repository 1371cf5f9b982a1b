package upgrade

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

var tNow = time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)

// budgeted is automatic with maxUnavailable and maxFailed.
func budgeted(maxUnavailable, maxFailed *intstr.IntOrString) *kmmv1beta1.UpgradePolicy {
	return &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: maxUnavailable, MaxFailed: maxFailed}
}

// backingOff is a node labelled v2 whose load of v2 failed (LoadBackOff with the pair's reason).
func backingOff(name string) RolloutNode {
	n := upgrading(name, kmmv1beta1.StateLoadBackOff, "")
	n.Reason, n.Message, n.Since = "ImagePull", "pulling reg/nic:v2: not found", tNow.Add(-time.Minute)
	return n
}

func since(n RolloutNode, d time.Duration) RolloutNode { n.Since = tNow.Add(-d); return n }

func TestNodeFailure(t *testing.T) {
	drain := &kmmv1beta1.DrainSpec{TimeoutSeconds: 60, PDBForceDrainTimeoutSeconds: 100, ExpectedDrainSeconds: 20}
	draining := func(started time.Duration) RolloutNode {
		n := since(upgrading("a", kmmv1beta1.StateDevicePluginDraining, "v1"), started)
		n.DrainStart = tNow.Add(-started)
		return n
	}
	cases := []struct {
		name   string
		policy kmmv1beta1.UpgradePolicy
		node   RolloutNode
		reason string // "" when not failed
	}{
		{"a load backing off fails with the pair's reason", kmmv1beta1.UpgradePolicy{}, backingOff("a"), "ImagePull"},
		{"an unload backing off fails", kmmv1beta1.UpgradePolicy{},
			func() RolloutNode {
				n := upgrading("a", kmmv1beta1.StateUnloadBackOff, "v1")
				n.Reason = "Busy"
				return n
			}(), "Busy"},
		{"Loading is not a failure", kmmv1beta1.UpgradePolicy{}, since(upgrading("a", kmmv1beta1.StateLoading, ""), time.Hour), ""},
		{"no timeout: a long state is not a failure", kmmv1beta1.UpgradePolicy{}, since(upgrading("a", kmmv1beta1.StateUpgrading, ""), 24*time.Hour), ""},
		{"a state held nodeTimeoutSeconds fails", kmmv1beta1.UpgradePolicy{NodeTimeoutSeconds: 600},
			since(upgrading("a", kmmv1beta1.StateUpgrading, ""), 10*time.Minute), kmmv1beta1.ReasonUpgradeTimedOut},
		{"a second short of it does not", kmmv1beta1.UpgradePolicy{NodeTimeoutSeconds: 600},
			since(upgrading("a", kmmv1beta1.StateUpgrading, ""), 10*time.Minute-time.Second), ""},
		{"Loaded with the old version is never timed out (the upgrade has not started)", kmmv1beta1.UpgradePolicy{NodeTimeoutSeconds: 600},
			since(upgrading("a", kmmv1beta1.StateLoaded, "v1"), 48*time.Hour), ""},
		{"a drain past max(timeout, expected+pdbForce) fails", kmmv1beta1.UpgradePolicy{Drain: drain}, draining(120 * time.Second), kmmv1beta1.ReasonDrainTimedOut},
		{"a drain before it does not", kmmv1beta1.UpgradePolicy{Drain: drain}, draining(119 * time.Second), ""},
		{"a drain without drain policy is the node timeout's", kmmv1beta1.UpgradePolicy{}, draining(time.Hour), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reason, msg, failed := tc.node.failure(tc.node.Labels[tLabel], &tc.policy, tNow)
			if failed != (tc.reason != "") || reason != tc.reason {
				t.Fatalf("failure = %q, %v (%s), want %q", reason, failed, msg, tc.reason)
			}
			if failed && msg == "" {
				t.Fatal("a failure without a message")
			}
		})
	}
}

func TestFailedNodesCountAgainstMaxUnavailable(t *testing.T) {
	d := DecideRollout(RolloutInput{Module: rolloutModule("v2", budgeted(intOf(2), nil)), Now: tNow,
		Nodes: []RolloutNode{backingOff("a"), onV1("b"), onV1("c")}})
	if want := to("v2", "b"); !reflect.DeepEqual(d.Intents, want) {
		t.Fatalf("intents %v, want %v: a failed node is unavailable", d.Intents, want)
	}
	if d.Progress.Failed != 1 || d.Progress.Unavailable != 1 {
		t.Fatalf("progress %+v, want 1 failed, 1 unavailable", d.Progress)
	}
	want := map[kmmv1beta1.UpgradeState]int32{kmmv1beta1.UpgradeFailed: 1, kmmv1beta1.UpgradePending: 2}
	if !reflect.DeepEqual(d.Status.NodesByUpgradeState, want) {
		t.Fatalf("nodesByUpgradeState %v, want %v", d.Status.NodesByUpgradeState, want)
	}
	if d.Status.Paused != nil || d.PausedNow {
		t.Fatalf("no maxFailed, yet paused: %+v", d.Status.Paused)
	}
}

func TestFailureBudget(t *testing.T) {
	type tc struct {
		name       string
		policy     *kmmv1beta1.UpgradePolicy
		prev       *kmmv1beta1.RolloutStatus
		resume     string
		nodes      []RolloutNode
		paused     string // the pause's reason, "" for none
		pausedNow  bool
		want       []Intent
		atResume   int32
		maxFailedR int32
	}
	budgetPause := &kmmv1beta1.RolloutPause{Reason: kmmv1beta1.ReasonFailureBudgetExceeded, Since: metav1.NewTime(tNow.Add(-time.Hour))}
	cases := []tc{
		{name: "below the budget: goes on", policy: budgeted(intOf(2), intOf(2)),
			nodes: []RolloutNode{backingOff("a"), onV1("b"), onV1("c")}, want: to("v2", "b"), maxFailedR: 2},
		{name: "at the budget: pauses now, starts nothing", policy: budgeted(intOf(3), intOf(1)),
			nodes: []RolloutNode{backingOff("a"), onV1("b"), onV1("c")}, paused: kmmv1beta1.ReasonFailureBudgetExceeded, pausedNow: true, maxFailedR: 1},
		{name: "a percentage: 50% of 4 is 2", policy: budgeted(intOf(4), pct("50%")),
			nodes: []RolloutNode{backingOff("a"), backingOff("b"), onV1("c"), onV1("d")}, paused: kmmv1beta1.ReasonFailureBudgetExceeded, pausedNow: true, maxFailedR: 2},
		{name: "a small percentage is at least 1", policy: budgeted(intOf(4), pct("10%")),
			nodes: []RolloutNode{backingOff("a"), onV1("b"), onV1("c")}, paused: kmmv1beta1.ReasonFailureBudgetExceeded, pausedNow: true, maxFailedR: 1},
		{name: "the pause stays though the node recovered", policy: budgeted(intOf(1), intOf(1)),
			prev:  &kmmv1beta1.RolloutStatus{Version: "v2", Paused: budgetPause},
			nodes: []RolloutNode{onV2("a"), onV1("b")}, paused: kmmv1beta1.ReasonFailureBudgetExceeded, maxFailedR: 1},
		{name: "the pause of another version lapses", policy: budgeted(intOf(1), intOf(1)),
			prev:  &kmmv1beta1.RolloutStatus{Version: "v1", Paused: budgetPause},
			nodes: []RolloutNode{onV1("a"), onV1("b")}, want: to("v2", "a"), maxFailedR: 1},
		{name: "a resume lifts it and goes on", policy: budgeted(intOf(1), intOf(1)),
			prev: &kmmv1beta1.RolloutStatus{Version: "v2", Paused: budgetPause, ObservedResume: "t1"}, resume: "t2",
			nodes: []RolloutNode{onV2("a"), onV1("b")}, want: to("v2", "b"), maxFailedR: 1},
		{name: "a resume already observed does not", policy: budgeted(intOf(1), intOf(1)),
			prev: &kmmv1beta1.RolloutStatus{Version: "v2", Paused: budgetPause, ObservedResume: "t1"}, resume: "t1",
			nodes: []RolloutNode{onV2("a"), onV1("b")}, paused: kmmv1beta1.ReasonFailureBudgetExceeded, maxFailedR: 1},
		{name: "the nodes failed at resume do not count", policy: budgeted(intOf(2), intOf(1)),
			prev: &kmmv1beta1.RolloutStatus{Version: "v2", Paused: budgetPause}, resume: "t1",
			nodes: []RolloutNode{backingOff("a"), onV1("b"), onV1("c")}, want: to("v2", "b"), atResume: 1, maxFailedR: 1},
		{name: "a failure beyond them pauses again", policy: budgeted(intOf(3), intOf(1)),
			prev: &kmmv1beta1.RolloutStatus{Version: "v2", FailedAtResume: 1, ObservedResume: "t1"}, resume: "t1",
			nodes: []RolloutNode{backingOff("a"), backingOff("b"), onV1("c")}, paused: kmmv1beta1.ReasonFailureBudgetExceeded, pausedNow: true, atResume: 1, maxFailedR: 1},
		{name: "failedAtResume shrinks as failed nodes recover", policy: budgeted(intOf(3), intOf(1)),
			prev: &kmmv1beta1.RolloutStatus{Version: "v2", FailedAtResume: 2, ObservedResume: "t1"}, resume: "t1",
			nodes: []RolloutNode{backingOff("a"), onV2("b"), onV1("c")}, want: to("v2", "c"), atResume: 1, maxFailedR: 1},
		{name: "paused by the user: nothing starts", policy: func() *kmmv1beta1.UpgradePolicy { p := budgeted(intOf(2), nil); p.Paused = true; return p }(),
			nodes: []RolloutNode{onV1("a"), onV1("b")}, paused: kmmv1beta1.ReasonPausedByUser},
		{name: "a paused rollout still retargets a node on its way to a version the Module left",
			policy: func() *kmmv1beta1.UpgradePolicy { p := budgeted(intOf(2), nil); p.Paused = true; return p }(),
			nodes:  []RolloutNode{upgrading("a", kmmv1beta1.StateUnloading, "v1"), onV1("b")}, paused: kmmv1beta1.ReasonPausedByUser,
			want: to("v3", "a")},
		{name: "skipped failed nodes do not count", policy: budgeted(intOf(2), intOf(1)),
			nodes: []RolloutNode{skipped(backingOff("a")), onV1("b")}, want: to("v2", "b"), maxFailedR: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			version := "v2"
			if c.name == "a paused rollout still retargets a node on its way to a version the Module left" {
				version = "v3"
			}
			m := rolloutModule(version, c.policy)
			m.Status.Rollout = c.prev
			if c.resume != "" {
				m.Annotations = map[string]string{kmmv1beta1.RolloutResumeAnnotation: c.resume}
			}
			d := DecideRollout(RolloutInput{Module: m, Nodes: c.nodes, Now: tNow})
			gotPause := ""
			if d.Status.Paused != nil {
				gotPause = d.Status.Paused.Reason
			}
			if gotPause != c.paused || d.PausedNow != c.pausedNow {
				t.Fatalf("paused %q (now %v), want %q (now %v): %+v", gotPause, d.PausedNow, c.paused, c.pausedNow, d.Status.Paused)
			}
			if !reflect.DeepEqual(d.Intents, c.want) {
				t.Fatalf("intents %v, want %v", d.Intents, c.want)
			}
			if d.Status.FailedAtResume != c.atResume || d.Status.MaxFailed != c.maxFailedR {
				t.Fatalf("failedAtResume %d, maxFailed %d; want %d, %d", d.Status.FailedAtResume, d.Status.MaxFailed, c.atResume, c.maxFailedR)
			}
			if c.resume != "" && d.Status.ObservedResume != c.resume {
				t.Fatalf("observedResume %q, want %q", d.Status.ObservedResume, c.resume)
			}
		})
	}
}

func TestPauseMessageAndNodes(t *testing.T) {
	m := rolloutModule("v2", budgeted(intOf(3), intOf(2)))
	d := DecideRollout(RolloutInput{Module: m, Now: tNow, Nodes: []RolloutNode{
		backingOff("c"), upgrading("b", kmmv1beta1.StateUnloading, "v1"), backingOff("a"), onV1("d")}})
	if d.Status.Paused == nil {
		t.Fatal("2 failed nodes, maxFailed 2: not paused")
	}
	for _, want := range []string{"2 of 4 nodes UpgradeFailed", "maxFailed is 2", "a (ImagePull), c (ImagePull)", "kubectl kmm rollout resume"} {
		if !strings.Contains(d.Status.Paused.Message, want) {
			t.Errorf("pause message %q lacks %q", d.Status.Paused.Message, want)
		}
	}
	var got []string
	for _, n := range d.Status.Nodes {
		got = append(got, n.Name+":"+string(n.State)+":"+n.Reason)
	}
	if want := []string{"a:UpgradeFailed:ImagePull", "c:UpgradeFailed:ImagePull", "b:Upgrading:"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("status nodes %v, want %v", got, want)
	}
	if len(d.NewlyFailed) != 2 {
		t.Fatalf("newly failed %v, want a and c", d.NewlyFailed)
	}
	// The next step, from the status written: no new pause, nobody newly failed, the same Since.
	m.Status.Rollout = d.Status
	next := DecideRollout(RolloutInput{Module: m, Now: tNow.Add(time.Minute), Nodes: []RolloutNode{
		backingOff("c"), upgrading("b", kmmv1beta1.StateUnloading, "v1"), backingOff("a"), onV1("d")}})
	if next.PausedNow || len(next.NewlyFailed) != 0 || !next.Status.Paused.Since.Equal(&d.Status.Paused.Since) {
		t.Fatalf("second step: pausedNow %v, newly failed %v, since %v (was %v)", next.PausedNow, next.NewlyFailed, next.Status.Paused.Since, d.Status.Paused.Since)
	}
}

func TestStatusNodesBounded(t *testing.T) {
	var ns []RolloutNode
	for i := range 40 {
		ns = append(ns, backingOff(string(rune('A'+i))))
	}
	d := DecideRollout(RolloutInput{Module: rolloutModule("v2", budgeted(intOf(50), nil)), Now: tNow, Nodes: ns})
	if len(d.Status.Nodes) != kmmv1beta1.MaxRolloutNodesListed || d.Status.NodesByUpgradeState[kmmv1beta1.UpgradeFailed] != 40 {
		t.Fatalf("%d nodes listed, %v counted; want %d listed, 40 failed", len(d.Status.Nodes), d.Status.NodesByUpgradeState, kmmv1beta1.MaxRolloutNodesListed)
	}
}
