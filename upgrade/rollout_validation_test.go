package upgrade

import (
	"reflect"
	"testing"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// validated is automatic with maxUnavailable and a validation pod.
func validated(maxUnavailable int) *kmmv1beta1.UpgradePolicy {
	p := budgeted(intOf(maxUnavailable), nil)
	p.Validation = &kmmv1beta1.ValidationSpec{Container: kmmv1beta1.ValidationContainerSpec{Image: "reg.example.com/check:1"}}
	return p
}

func withValidation(n RolloutNode, phase ValidationPhase, msg string) RolloutNode {
	n.Validation = ValidationPod{Phase: phase, Message: msg}
	return n
}

func dpPending(n RolloutNode) RolloutNode { n.DevicePluginPending = true; return n }

func TestValidationAfterLoad(t *testing.T) {
	cases := []struct {
		name     string
		policy   *kmmv1beta1.UpgradePolicy
		nodes    []RolloutNode
		want     []Intent
		validate []string
		done     int
		failed   int
		reason   string // the first listed node's reason
	}{
		{name: "no validation: Loaded v2 is done", policy: budgeted(intOf(1), nil),
			nodes: []RolloutNode{onV2("a"), onV1("b")}, want: to("v2", "b"), done: 1},
		{name: "loaded, no validation pod yet: it is created, the node counts against maxUnavailable", policy: validated(1),
			nodes: []RolloutNode{onV2("a"), onV1("b")}, validate: []string{"a"}, reason: kmmv1beta1.ReasonValidating},
		{name: "validation running: still unavailable", policy: validated(1),
			nodes: []RolloutNode{withValidation(onV2("a"), ValidationRunning, ""), onV1("b")}, reason: kmmv1beta1.ReasonValidating},
		{name: "validation succeeded: done, the next node starts", policy: validated(1),
			nodes: []RolloutNode{withValidation(onV2("a"), ValidationSucceeded, ""), onV1("b")}, want: to("v2", "b"), done: 1},
		{name: "validation failed: UpgradeFailed, unavailable", policy: validated(1),
			nodes: []RolloutNode{withValidation(onV2("a"), ValidationFailed, "exit 3: no device"), onV1("b")}, failed: 1, reason: kmmv1beta1.ReasonValidationFailed},
		{name: "device plugin not Ready: not done, no validation pod yet", policy: validated(1),
			nodes: []RolloutNode{dpPending(onV2("a")), onV1("b")}, reason: kmmv1beta1.ReasonDevicePluginNotReady},
		{name: "device plugin not Ready without validation: not done either", policy: budgeted(intOf(1), nil),
			nodes: []RolloutNode{dpPending(onV2("a")), onV1("b")}, reason: kmmv1beta1.ReasonDevicePluginNotReady},
		{name: "a node still loading gets no validation pod", policy: validated(2),
			nodes: []RolloutNode{upgrading("a", kmmv1beta1.StateLoading, ""), onV1("b")}, want: to("v2", "b")},
		{name: "every loaded node without a pod gets one at once (they are not disrupted)", policy: validated(1),
			nodes: []RolloutNode{onV2("a"), onV2("b")}, validate: []string{"a", "b"}, reason: kmmv1beta1.ReasonValidating},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideRollout(RolloutInput{Module: rolloutModule("v2", tc.policy), Nodes: tc.nodes, Now: tNow})
			if !reflect.DeepEqual(d.Intents, tc.want) || !reflect.DeepEqual(d.Validate, tc.validate) {
				t.Fatalf("intents %v, validate %v; want %v, %v", d.Intents, d.Validate, tc.want, tc.validate)
			}
			if d.Progress.Done != tc.done || d.Progress.Failed != tc.failed {
				t.Fatalf("progress %+v: want %d done, %d failed", d.Progress, tc.done, tc.failed)
			}
			if tc.reason != "" && (len(d.Status.Nodes) == 0 || d.Status.Nodes[0].Reason != tc.reason) {
				t.Fatalf("status nodes %+v: want the first with reason %s", d.Status.Nodes, tc.reason)
			}
		})
	}
}

func TestNodeTimeoutCountsFromTheLoadWhileValidating(t *testing.T) {
	p := validated(1)
	p.NodeTimeoutSeconds = 60
	n := since(withValidation(onV2("a"), ValidationRunning, ""), 2*time.Minute)
	d := DecideRollout(RolloutInput{Module: rolloutModule("v2", p), Nodes: []RolloutNode{n}, Now: tNow})
	if d.Progress.Failed != 1 || d.Status.Nodes[0].Reason != kmmv1beta1.ReasonUpgradeTimedOut {
		t.Fatalf("a validation running past nodeTimeoutSeconds: %+v", d.Status.Nodes)
	}
}
