package upgrade

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

const (
	tNS   = "ns"
	tName = "nic"
)

var (
	tLabel = kmmv1beta1.ModuleVersionLabel(tNS, tName)
	tSkip  = kmmv1beta1.UpgradeSkipLabel(tNS, tName)
)

// rolloutModule is a Module at version with the given upgradePolicy.
func rolloutModule(version string, policy *kmmv1beta1.UpgradePolicy) *kmmv1beta1.Module {
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: tNS, Name: tName}}
	m.Spec.ModuleLoader = &kmmv1beta1.ModuleLoaderSpec{}
	m.Spec.ModuleLoader.Container.Version = version
	m.Spec.UpgradePolicy = policy
	return m
}

func auto(maxUnavailable *intstr.IntOrString) *kmmv1beta1.UpgradePolicy {
	return &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: maxUnavailable}
}

func intOf(i int) *intstr.IntOrString  { v := intstr.FromInt32(int32(i)); return &v }
func pct(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }

// onV1 is a Ready node labelled v1 with v1 loaded.
func onV1(name string) RolloutNode {
	return RolloutNode{Name: name, Labels: map[string]string{tLabel: "v1"}, Ready: true, State: kmmv1beta1.StateLoaded, LoadedVersion: "v1"}
}

// onV2 is a Ready node labelled v2 with v2 loaded (done).
func onV2(name string) RolloutNode {
	return RolloutNode{Name: name, Labels: map[string]string{tLabel: "v2"}, Ready: true, State: kmmv1beta1.StateLoaded, LoadedVersion: "v2"}
}

// upgrading is a node labelled v2 whose pair is still in state.
func upgrading(name string, state kmmv1beta1.ModuleState, loaded string) RolloutNode {
	return RolloutNode{Name: name, Labels: map[string]string{tLabel: "v2"}, Ready: true, State: state, LoadedVersion: loaded}
}

func kmmCordoned(n RolloutNode) RolloutNode {
	n.Unschedulable, n.CordonedByKMM = true, true
	return n
}
func notReady(n RolloutNode) RolloutNode   { n.Ready = false; return n }
func cordoned(n RolloutNode) RolloutNode   { n.Unschedulable = true; return n }
func unlabelled(n RolloutNode) RolloutNode { n.Labels = map[string]string{}; return n }
func skipped(n RolloutNode) RolloutNode {
	n.Labels = map[string]string{tLabel: n.Labels[tLabel], tSkip: ""}
	return n
}

func nodes(f func(string) RolloutNode, names ...string) []RolloutNode {
	out := make([]RolloutNode, 0, len(names))
	for _, n := range names {
		out = append(out, f(n))
	}
	return out
}

func to(version string, names ...string) []Intent {
	var out []Intent
	for _, n := range names {
		out = append(out, Intent{Node: n, Version: version})
	}
	return out
}

func TestPlanRollout(t *testing.T) {
	cases := []struct {
		name   string
		module *kmmv1beta1.Module
		nodes  []RolloutNode
		want   []Intent
	}{
		{"no upgradePolicy: manual, nothing", rolloutModule("v2", nil), nodes(onV1, "a", "b"), nil},
		{"automatic false: nothing", rolloutModule("v2", &kmmv1beta1.UpgradePolicy{MaxUnavailable: intOf(2)}), nodes(onV1, "a", "b"), nil},
		{"no version: nothing", rolloutModule("", auto(intOf(2))), nodes(onV1, "a", "b"), nil},
		{"maxUnavailable unset: one node, first by name", rolloutModule("v2", auto(nil)), nodes(onV1, "c", "a", "b"), to("v2", "a")},
		{"maxUnavailable 2: two nodes by name", rolloutModule("v2", auto(intOf(2))), nodes(onV1, "d", "c", "b", "a"), to("v2", "a", "b")},
		{"maxUnavailable above the node count: all", rolloutModule("v2", auto(intOf(10))), nodes(onV1, "b", "a"), to("v2", "a", "b")},
		{"maxUnavailable 0: nothing ever starts", rolloutModule("v2", auto(intOf(0))), nodes(onV1, "a", "b"), nil},
		{"50% of 4 nodes: 2", rolloutModule("v2", auto(pct("50%"))), nodes(onV1, "a", "b", "c", "d"), to("v2", "a", "b")},
		{"30% of 4 nodes rounds down to 1", rolloutModule("v2", auto(pct("30%"))), nodes(onV1, "a", "b", "c", "d"), to("v2", "a")},
		{"10% of 4 nodes is 0.4: at least 1", rolloutModule("v2", auto(pct("10%"))), nodes(onV1, "a", "b", "c", "d"), to("v2", "a")},
		{"0% of 4 nodes: nothing", rolloutModule("v2", auto(pct("0%"))), nodes(onV1, "a", "b", "c", "d"), nil},
		{"unparsable maxUnavailable: 1", rolloutModule("v2", auto(pct("half"))), nodes(onV1, "a", "b"), to("v2", "a")},
		{"a node in progress uses the budget", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{onV1("a"), upgrading("b", kmmv1beta1.StateUnloading, "v1"), onV1("c")}, nil},
		{"one in progress of 2: one more starts", rolloutModule("v2", auto(intOf(2))),
			[]RolloutNode{onV1("a"), upgrading("b", kmmv1beta1.StateDevicePluginDraining, "v1"), onV1("c")}, to("v2", "a")},
		{"labelled v2 and Loaded but with v1 still: in progress", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{upgrading("a", kmmv1beta1.StateLoaded, "v1"), onV1("b")}, nil},
		{"labelled v2, nothing loaded yet (Upgrading): in progress", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{upgrading("a", kmmv1beta1.StateUpgrading, ""), onV1("b")}, nil},
		{"labelled v2, back-off: in progress", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{upgrading("a", kmmv1beta1.StateLoadBackOff, ""), onV1("b")}, nil},
		{"done nodes free the budget", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{onV2("a"), onV2("b"), onV1("c"), onV1("d")}, to("v2", "c")},
		{"all done: nothing", rolloutModule("v2", auto(intOf(1))), nodes(onV2, "a", "b"), nil},
		{"a NotReady pending node counts and never starts", rolloutModule("v2", auto(intOf(2))),
			[]RolloutNode{notReady(onV1("a")), onV1("b"), onV1("c")}, to("v2", "b")},
		{"a cordoned pending node counts and never starts", rolloutModule("v2", auto(intOf(2))),
			[]RolloutNode{cordoned(onV1("a")), onV1("b"), onV1("c")}, to("v2", "b")},
		{"cordoned and NotReady nodes use up the whole budget", rolloutModule("v2", auto(intOf(2))),
			[]RolloutNode{cordoned(onV1("a")), notReady(onV1("b")), onV1("c")}, nil},
		{"a node both cordoned and NotReady counts once", rolloutModule("v2", auto(intOf(2))),
			[]RolloutNode{cordoned(notReady(onV1("a"))), onV1("b"), onV1("c")}, to("v2", "b")},
		{"an in-progress NotReady node counts once", rolloutModule("v2", auto(intOf(2))),
			[]RolloutNode{notReady(upgrading("a", kmmv1beta1.StateLoading, "")), onV1("b"), onV1("c")}, to("v2", "b")},
		{"a NotReady node already done counts", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{notReady(onV2("a")), onV1("b")}, nil},
		{"a done node still cordoned (kmm's uncordon not through yet) counts", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{cordoned(onV2("a")), onV1("b")}, nil},
		{"a node on its way to a version the Module no longer has is retargeted at once", rolloutModule("v3", auto(intOf(1))),
			[]RolloutNode{cordoned(upgrading("a", kmmv1beta1.StateUpgrading, "")), cordoned(onV1("b")), onV1("c")}, to("v3", "a")},
		{"a retargeted node uses the budget", rolloutModule("v3", auto(intOf(2))),
			[]RolloutNode{upgrading("b", kmmv1beta1.StateDevicePluginDraining, "v1"), onV1("a"), onV1("c")}, to("v3", "b", "a")},
		{"a node kmm cordoned for a version the Module no longer has is retargeted, whatever its state", rolloutModule("v3", auto(intOf(1))),
			[]RolloutNode{kmmCordoned(upgrading("a", kmmv1beta1.StateLoadBackOff, "")), onV1("b")}, to("v3", "a")},
		{"a reload of the label's own version (after a reboot) is pending, not retargeted", rolloutModule("v3", auto(intOf(1))),
			[]RolloutNode{upgrading("a", kmmv1beta1.StateLoading, ""), upgrading("b", kmmv1beta1.StateLoading, "")}, to("v3", "a")},
		{"a node labelled with another version and Loaded with it is pending", rolloutModule("v3", auto(intOf(1))),
			[]RolloutNode{cordoned(onV2("a")), onV1("b")}, nil},
		{"unlabelled nodes are adopted", rolloutModule("v2", auto(intOf(2))),
			nodes(func(n string) RolloutNode { return unlabelled(onV1(n)) }, "b", "a", "c"), to("v2", "a", "b")},
		{"a fresh unlabelled node without status is adopted", rolloutModule("v1", auto(nil)),
			[]RolloutNode{{Name: "a", Ready: true}}, to("v1", "a")},
		{"a node labelled with another version is pending", rolloutModule("v3", auto(intOf(1))),
			[]RolloutNode{onV2("a")}, to("v3", "a")},
		{"skipped nodes are never touched", rolloutModule("v2", auto(intOf(5))),
			[]RolloutNode{skipped(onV1("a")), onV1("b"), skipped(unlabelled(onV1("c")))}, to("v2", "b")},
		{"skipped nodes do not count against the budget, even NotReady or in progress", rolloutModule("v2", auto(intOf(1))),
			[]RolloutNode{skipped(notReady(onV1("a"))), skipped(upgrading("b", kmmv1beta1.StateUnloading, "v1")), onV1("c")}, to("v2", "c")},
		{"skipped nodes are not in the percentage's base", rolloutModule("v2", auto(pct("50%"))),
			[]RolloutNode{skipped(onV1("a")), skipped(onV1("b")), onV1("c"), onV1("d")}, to("v2", "c")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := firstIntents(PlanRollout(RolloutInput{Module: tc.module, Nodes: tc.nodes}))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("PlanRollout = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlanRolloutIgnoresADeletedModule(t *testing.T) {
	m := rolloutModule("v2", auto(intOf(2)))
	now := metav1.Now()
	m.DeletionTimestamp = &now
	if got := firstIntents(PlanRollout(RolloutInput{Module: m, Nodes: nodes(onV1, "a")})); got != nil {
		t.Fatalf("PlanRollout of a Module being deleted = %v, want nothing", got)
	}
}

func TestRolloutProgress(t *testing.T) {
	in := RolloutInput{Module: rolloutModule("v2", auto(pct("50%"))), Nodes: []RolloutNode{
		onV2("a"), upgrading("b", kmmv1beta1.StateUnloading, "v1"), notReady(onV1("c")), onV1("d"), skipped(onV1("e")),
	}}
	got := progressOf(in)
	want := Progress{Total: 4, Done: 1, InProgress: 1, Pending: 2, Unavailable: 2, Budget: 2, Skipped: 1}
	if got != want {
		t.Fatalf("progress = %+v, want %+v", got, want)
	}
	if got.Complete() {
		t.Fatal("a rollout with pending nodes is not complete")
	}
	if !progressOf(RolloutInput{Module: in.Module, Nodes: nodes(onV2, "a", "b")}).Complete() {
		t.Fatal("a rollout with every node done is complete")
	}
}

// firstIntents keeps the intents of a plan.
func firstIntents(intents []Intent, _ Progress) []Intent { return intents }

// progressOf keeps the classification of a plan.
func progressOf(in RolloutInput) Progress {
	_, p := PlanRollout(in)
	return p
}
