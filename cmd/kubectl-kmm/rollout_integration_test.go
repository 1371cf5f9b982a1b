package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestRolloutCommands runs `kubectl kmm rollout` against the operator: a Module rolled out
// automatically over two nodes is paused (spec.upgradePolicy.paused), moved to v2 and shown paused
// with both nodes pending and still labelled v1; resumed, it completes, and `rollout status` says
// so (table and json). `rollout undo` then sends both nodes back to v1, whose config only
// status.rollout.previous still holds. A Module without an automatic rollout is refused.
func TestRolloutCommands(t *testing.T) {
	ctx := context.Background()
	cluster.StartOperator(t)
	k8s := cluster.Client
	kubeconfig := writeKubeconfig(t, cluster.Env)
	const ns, sel = "rollout-cli", "kmm-rollout-cli"
	versionKey := kmmv1beta1.ModuleVersionLabel(ns, "nic")
	nodes := []string{"rollout-1", "rollout-2"}
	for _, n := range nodes {
		if err := cluster.Agent.AddNode(ctx, n, kernel, map[string]string{sel: "yes", versionKey: "v1"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	manual := testModule(ns, "manual", sel+"-none")
	if err := k8s.Create(ctx, manual); err != nil {
		t.Fatal(err)
	}
	if _, err := kmm(t, "rollout", "pause", ns+"/manual", "--kubeconfig", kubeconfig); err == nil || !strings.Contains(err.Error(), "no automatic rollout") {
		t.Fatalf("rollout pause of a manual Module: %v", err)
	}

	one := intstr.FromInt32(1)
	m := testModule(ns, "nic", sel)
	m.Spec.ModuleLoader.Container.Version = "v1"
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/nic:v1"
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one}
	if err := k8s.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	rolloutStatus := func(want ...string) string {
		t.Helper()
		var out string
		eventually(t, fmt.Sprintf("rollout status to say %q", want), func() bool {
			var err error
			out, err = kmm(t, "rollout", "status", ns+"/nic", "--kubeconfig", kubeconfig)
			for _, w := range want {
				if err != nil || !strings.Contains(out, w) {
					return false
				}
			}
			return true
		})
		return out
	}
	rolloutStatus("complete v1", "Upgraded 2")

	if out, err := kmm(t, "rollout", "pause", "nic", "-n", ns, "--kubeconfig", kubeconfig); err != nil || !strings.Contains(out, "rollout paused") {
		t.Fatalf("rollout pause: %q, %v", out, err)
	}
	bump(t, k8s, ns, "nic", "v2", "reg.example.com/nic:v2")
	out := rolloutStatus("rolling out v2", "PAUSED (PausedByUser", "UpgradePending 2")
	if st, err := kmm(t, "status", ns+"/nic", "--kubeconfig", kubeconfig, "--width", "200"); err != nil ||
		!strings.Contains(st, "; rollout of v2 paused (PausedByUser)") {
		t.Fatalf("kubectl kmm status of a paused rollout (%v):\n%s", err, st)
	}
	t.Logf("kubectl kmm rollout status (paused):\n%s", out)
	for _, n := range nodes {
		node := &corev1.Node{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: n}, node); err != nil || node.Labels[versionKey] != "v1" {
			t.Fatalf("node %s: version-module label %q (%v), want v1: the paused rollout started it", n, node.Labels[versionKey], err)
		}
	}

	if out, err := kmm(t, "rollout", "resume", ns+"/nic", "--kubeconfig", kubeconfig); err != nil || !strings.Contains(out, "rollout resumed") {
		t.Fatalf("rollout resume: %q, %v", out, err)
	}
	got := &kmmv1beta1.Module{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil || got.Spec.UpgradePolicy.Paused ||
		got.Annotations[kmmv1beta1.RolloutResumeAnnotation] == "" {
		t.Fatalf("after resume: paused %v, resume annotation %q (%v)", got.Spec.UpgradePolicy.Paused, got.Annotations[kmmv1beta1.RolloutResumeAnnotation], err)
	}
	out = rolloutStatus("complete v2", "Upgraded 2")
	if strings.Contains(out, "PAUSED") {
		t.Fatalf("rollout status after resume:\n%s", out)
	}
	js, err := kmm(t, "rollout", "status", ns+"/nic", "-o", "json", "--kubeconfig", kubeconfig)
	var st kmmv1beta1.RolloutStatus
	if err != nil || json.Unmarshal([]byte(js), &st) != nil || st.Version != "v2" || st.NodesByUpgradeState[kmmv1beta1.Upgraded] != 2 {
		t.Fatalf("rollout status -o json (%v):\n%s", err, js)
	}
	if st.Previous == nil || st.Previous.Version != "v1" || len(st.Previous.Configs) != 1 || st.Previous.Configs[0].Config.ContainerImage != "reg.example.com/nic:v1" {
		t.Fatalf("status.rollout.previous = %+v, want v1's config", st.Previous)
	}

	// Undo: both nodes go back to v1, one at a time, and load v1's image again; v2's mappings are
	// the only ones in the Module.
	if out, err := kmm(t, "rollout", "undo", ns+"/nic", "--kubeconfig", kubeconfig); err != nil || !strings.Contains(out, "every node goes back to v1") {
		t.Fatalf("rollout undo: %q, %v", out, err)
	}
	out = rolloutStatus("ROLLING BACK to v1 (Undo", "RolledBack 2")
	t.Logf("kubectl kmm rollout status (undone):\n%s", out)
	for _, n := range nodes {
		nmc := &kmmv1beta1.NodeModulesConfig{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: n}, nmc); err != nil {
			t.Fatal(err)
		}
		if e := nmc.StatusEntry(ns, "nic"); e == nil || e.State != kmmv1beta1.StateLoaded || e.Config == nil ||
			e.Config.Version != "v1" || e.Config.ContainerImage != "reg.example.com/nic:v1" {
			t.Fatalf("node %s after the undo: %+v, want v1's image Loaded", n, e)
		}
		for _, tr := range nmc.StatusEntry(ns, "nic").Transitions {
			if tr.To == kmmv1beta1.StateLoading && tr.From == kmmv1beta1.StateLoaded {
				t.Fatalf("node %s loaded v1 straight from Loaded v2: %+v", n, nmc.StatusEntry(ns, "nic").Transitions)
			}
		}
	}
	// The user keeps v1: the Module asks for it again, and the rollout is complete. No node runs
	// v2 any more: an undo has nothing to go back to, and says so.
	bump(t, k8s, ns, "nic", "v1", "reg.example.com/nic:v1")
	rolloutStatus("complete v1", "Upgraded 2")
	if _, err := kmm(t, "rollout", "undo", ns+"/nic", "--kubeconfig", kubeconfig); err == nil || !strings.Contains(err.Error(), "no previous version") {
		t.Fatalf("rollout undo with no config of a previous version: %v", err)
	}
}

// bump moves a Module to version with image, in one update (seed 002).
func bump(t *testing.T, k8s client.Client, ns, name, version, image string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
			return err
		}
		m.Spec.ModuleLoader.Container.Version = version
		m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = image
		return k8s.Update(context.Background(), m)
	})
	if err != nil {
		t.Fatal(err)
	}
}
