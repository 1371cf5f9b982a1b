package fsm

import (
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestDecideSpecRollback: a node whose version-worker-pod label names the previous version of a
// rollback that covers it gets the previous version's config for its kernel; any other node
// whose label is older keeps its entry.
func TestDecideSpecRollback(t *testing.T) {
	const kernel = "5.14.0-1.el9.x86_64"
	workerPod := kmmv1beta1.WorkerPodVersionLabel("drivers", "nic")
	rolledBack := func(reason string, nodes ...string) *kmmv1beta1.Module {
		m := testModule("v2")
		m.Status.Rollout = &kmmv1beta1.RolloutStatus{Version: "v2",
			Previous: &kmmv1beta1.PreviousVersion{Version: "v1", Configs: []kmmv1beta1.PreviousConfig{{
				Config:             kmmv1beta1.ModuleConfig{KernelVersion: kernel, ContainerImage: "reg.example.com/nic:v1", Version: "v1"},
				ServiceAccountName: "old-sa"}}},
			Rollback: &kmmv1beta1.RolloutRollback{Version: "v1", Reason: reason, Nodes: nodes}}
		return m
	}
	other := rolledBack(kmmv1beta1.ReasonRollbackFailedNodes, "n1")
	other.Status.Rollout.Version = "v1" // a status of another version: not this rollout's rollback
	cases := []struct {
		name   string
		m      *kmmv1beta1.Module
		node   NodeView
		action SpecAction
	}{
		{"a failed node of the rollback", rolledBack(kmmv1beta1.ReasonRollbackFailedNodes, "n1"), testNode(kernel, map[string]string{workerPod: "v1"}), SpecUpdate},
		{"a node the rollback of failed nodes does not name", rolledBack(kmmv1beta1.ReasonRollbackFailedNodes, "n9"), testNode(kernel, map[string]string{workerPod: "v1"}), SpecKeep},
		{"any node of an undo", rolledBack(kmmv1beta1.ReasonRollbackUndo), testNode(kernel, map[string]string{workerPod: "v1"}), SpecUpdate},
		{"a kernel the previous version has no config for", rolledBack(kmmv1beta1.ReasonRollbackUndo), testNode("6.8.1", map[string]string{workerPod: "v1"}), SpecKeep},
		{"the worker-pod label not moved yet: the new version stays", rolledBack(kmmv1beta1.ReasonRollbackUndo), testNode(kernel, map[string]string{workerPod: "v2"}), SpecUpdate},
		{"no worker-pod label (the unload of the new version): no entry", rolledBack(kmmv1beta1.ReasonRollbackUndo), testNode(kernel, nil), SpecDelete},
		{"a status of another version", other, testNode(kernel, map[string]string{workerPod: "v1"}), SpecKeep},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideSpec(tc.m, tc.node)
			if d.Action != tc.action {
				t.Fatalf("action %s (%s), want %s", d.Action, d.Reason, tc.action)
			}
			if d.Action == SpecUpdate && d.Reason == ReasonRollback &&
				(d.Entry.Config.ContainerImage != "reg.example.com/nic:v1" || d.Entry.ServiceAccountName != "old-sa" || d.Entry.Config.Version != "v1") {
				t.Fatalf("entry %+v, want v1's config and pod settings", d.Entry)
			}
			if d.Action == SpecUpdate && tc.node.Labels[workerPod] == "v2" && d.Entry.Config.Version != "v2" {
				t.Fatalf("entry %+v, want v2's", d.Entry)
			}
		})
	}
}
