package upgrade

import (
	"reflect"
	"testing"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// canaryModule is v2 with maxUnavailable 3 and the given canary.
func canaryModule(c kmmv1beta1.CanarySpec) *kmmv1beta1.Module {
	p := auto(intOf(3))
	p.Canary = &c
	return rolloutModule("v2", p)
}

func labelled(n RolloutNode, key, value string) RolloutNode {
	n.Labels[key] = value
	return n
}

func TestCanaryChoice(t *testing.T) {
	cases := []struct {
		name   string
		canary kmmv1beta1.CanarySpec
		nodes  []RolloutNode
		want   []string
	}{
		{"no selector, no count: the first node by name", kmmv1beta1.CanarySpec{}, nodes(onV1, "c", "b", "d"), []string{"b"}},
		{"count 2", kmmv1beta1.CanarySpec{Count: 2}, nodes(onV1, "c", "b", "d"), []string{"b", "c"}},
		{"a selector: every node it matches", kmmv1beta1.CanarySpec{NodeSelector: map[string]string{"canary": "yes"}},
			[]RolloutNode{labelled(onV1("a"), "canary", "yes"), onV1("b"), labelled(onV1("c"), "canary", "yes")}, []string{"a", "c"}},
		{"a selector and a count", kmmv1beta1.CanarySpec{NodeSelector: map[string]string{"canary": "yes"}, Count: 1},
			[]RolloutNode{labelled(onV1("c"), "canary", "yes"), onV1("b"), labelled(onV1("a"), "canary", "yes")}, []string{"a"}},
		{"skipped nodes are never canaries", kmmv1beta1.CanarySpec{}, []RolloutNode{skipped(onV1("a")), onV1("b")}, []string{"b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideRollout(RolloutInput{Module: canaryModule(tc.canary), Nodes: tc.nodes, Now: tNow})
			if got := d.Status.Canary.Nodes; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("canary nodes %v, want %v", got, tc.want)
			}
			if !reflect.DeepEqual(d.Intents, to("v2", tc.want...)) {
				t.Fatalf("intents %v, want only the canaries %v (maxUnavailable 3)", d.Intents, tc.want)
			}
		})
	}
}

func TestCanarySoaks(t *testing.T) {
	m := canaryModule(kmmv1beta1.CanarySpec{Count: 1, SoakSeconds: 600})
	d := step(m, tNow, onV1("a"), onV1("b"), onV1("c"))
	if !reflect.DeepEqual(d.Intents, to("v2", "a")) || d.Status.NodesByUpgradeState[kmmv1beta1.CanaryWaiting] != 2 {
		t.Fatalf("intents %v, states %v: want the canary alone and two CanaryWaiting", d.Intents, d.Status.NodesByUpgradeState)
	}
	// The canary is Upgraded: the soak starts, the others wait.
	d = step(m, tNow.Add(time.Minute), onV2("a"), onV1("b"), onV1("c"))
	if d.Intents != nil || d.Status.Canary.SoakStart == nil || d.Status.Canary.Passed || !d.SoakEnds.Equal(tNow.Add(11*time.Minute)) {
		t.Fatalf("intents %v, canary %+v, soak ends %v: want the soak started and nothing else", d.Intents, d.Status.Canary, d.SoakEnds)
	}
	// A second short of the soak: still waiting.
	if d = step(m, tNow.Add(11*time.Minute-time.Second), onV2("a"), onV1("b"), onV1("c")); d.Intents != nil {
		t.Fatalf("intents %v before the soak ended", d.Intents)
	}
	// The soak ends: the others start within maxUnavailable; passed stays even if the canary breaks.
	d = step(m, tNow.Add(11*time.Minute), onV2("a"), onV1("b"), onV1("c"))
	if !reflect.DeepEqual(d.Intents, to("v2", "b", "c")) || !d.Status.Canary.Passed {
		t.Fatalf("intents %v, canary %+v: want b and c after the soak", d.Intents, d.Status.Canary)
	}
	d = step(m, tNow.Add(12*time.Minute), upgrading("a", kmmv1beta1.StateLoading, ""), onV1("b"), onV1("c"))
	if !d.Status.Canary.Passed {
		t.Fatal("a canary that passed went back to waiting")
	}
}

func TestCanarySoakRestartsWhenACanaryBreaks(t *testing.T) {
	m := canaryModule(kmmv1beta1.CanarySpec{Count: 2, SoakSeconds: 600})
	step(m, tNow, onV2("a"), onV2("b"), onV1("c"))
	first := *m.Status.Rollout.Canary.SoakStart
	step(m, tNow.Add(5*time.Minute), onV2("a"), notReadyLoading("b"), onV1("c"))
	if m.Status.Rollout.Canary.SoakStart != nil {
		t.Fatal("the soak went on while a canary was not Upgraded")
	}
	d := step(m, tNow.Add(10*time.Minute), onV2("a"), onV2("b"), onV1("c"))
	if d.Intents != nil || d.Status.Canary.SoakStart.Equal(&first) {
		t.Fatalf("intents %v, soak start %v: want the soak counted again from now", d.Intents, d.Status.Canary.SoakStart)
	}
}

func notReadyLoading(name string) RolloutNode {
	return notReady(upgrading(name, kmmv1beta1.StateLoading, ""))
}

func TestCanaryFailureCountsAgainstTheBudget(t *testing.T) {
	m := canaryModule(kmmv1beta1.CanarySpec{})
	m.Spec.UpgradePolicy.MaxFailed = intOf(1)
	d := step(m, tNow, backingOff("a"), onV1("b"))
	if d.Status.Paused == nil || d.Intents != nil {
		t.Fatalf("paused %v, intents %v: a failed canary pauses at the budget", d.Status.Paused, d.Intents)
	}
}
