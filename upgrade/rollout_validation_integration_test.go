package upgrade_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/testbed"
	"github.com/kmm-project/kmm/upgrade"
)

// TestRolloutValidatesAfterLoad is validation after load on a real API server: three nodes at v1
// with a device plugin, maxUnavailable 1, a validation pod. The first node's validation of v2 fails:
// the node is UpgradeFailed (ValidationFailed, with the container's message) and, still unavailable,
// keeps the second node from starting. Once the cause is fixed and the failed pod deleted, the
// rollout runs it again, and every node ends Loaded v2 with a succeeded validation pod of v2 on it;
// the validation pods of v1 are gone.
func TestRolloutValidatesAfterLoad(t *testing.T) {
	one := intstr.FromInt32(1)
	tb, m := loadedAtV1(t, 3, &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one,
		Validation: &kmmv1beta1.ValidationSpec{Container: kmmv1beta1.ValidationContainerSpec{Image: "reg.example.com/nic-check:1"}}}, true)
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	waitRollout(t, tb.NS, "v1 validated everywhere", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.NodesByUpgradeState[kmmv1beta1.Upgraded] == 3
	})

	first := tb.Nodes[0]
	node.SetValidationOutcome(func(p *corev1.Pod) (bool, string) {
		if p.Spec.NodeName == first && p.Labels[contract.LabelVersion] == "v2" {
			return false, "no device found on the PCI bus\nvalidator: exit 3"
		}
		return true, ""
	})
	t.Cleanup(func() { node.SetValidationOutcome(nil) })
	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")

	st := waitRollout(t, tb.NS, "the first node failed its validation", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.NodesByUpgradeState[kmmv1beta1.UpgradeFailed] == 1
	})
	if n := st.Nodes[0]; n.Name != first || n.Reason != kmmv1beta1.ReasonValidationFailed || !strings.Contains(n.Message, "no device found") {
		t.Fatalf("status.rollout.nodes[0] = %+v, want %s ValidationFailed with the container's message", n, first)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", first)
	assertLabels(t, label, map[string]string{tb.Nodes[1]: "v1", tb.Nodes[2]: "v1"})

	node.SetValidationOutcome(nil)
	failed := &corev1.Pod{}
	key := client.ObjectKey{Namespace: tb.NS, Name: upgrade.ValidationPodName(bumped(t, tb.NS), first)}
	if err := k8s.Get(context.Background(), key, failed); err != nil || failed.Status.Phase != corev1.PodFailed {
		t.Fatalf("the failed validation pod %s: %v, phase %s", key, err, failed.Status.Phase)
	}
	if err := k8s.Delete(context.Background(), failed); err != nil {
		t.Fatal(err)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", tb.Nodes...)
	waitRollout(t, tb.NS, "every node validated at v2", func(st *kmmv1beta1.RolloutStatus) bool {
		return st.NodesByUpgradeState[kmmv1beta1.Upgraded] == 3
	})
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.MatchingLabels{contract.LabelValidation: "true"}); err != nil {
		t.Fatal(err)
	}
	byNode := map[string]corev1.PodPhase{}
	for _, p := range pods.Items {
		if p.Labels[contract.LabelVersion] != "v2" && p.DeletionTimestamp == nil {
			t.Errorf("validation pod %s of version %s is still there", p.Name, p.Labels[contract.LabelVersion])
		}
		if p.Labels[contract.LabelVersion] == "v2" {
			byNode[p.Spec.NodeName] = p.Status.Phase
		}
	}
	for _, n := range tb.Nodes {
		if byNode[n] != corev1.PodSucceeded {
			t.Errorf("node %s: validation pod of v2 %q, want Succeeded", n, byNode[n])
		}
	}

	// The Module owns its validation pods: once it is deleted (and unloaded), they go with it.
	if err := k8s.Delete(context.Background(), bumped(t, tb.NS)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 90*time.Second, func() (bool, string) {
		if err := k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.MatchingLabels{contract.LabelValidation: "true"}); err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d validation pods left after the Module's deletion", len(pods.Items))
	})
}

// bumped reads the Module nic.
func bumped(t *testing.T, ns string) *kmmv1beta1.Module {
	t.Helper()
	m := &kmmv1beta1.Module{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "nic"}, m); err != nil {
		t.Fatal(err)
	}
	return m
}
