package upgrade_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestRolloutAutomaticWithDrain is the automatic rollout (maxUnavailable 1) over four nodes that
// run a Deployment under a PDB (minAvailable = replicas−1), a pod held by a finalizer and a pod in
// an ignored namespace: one node at a time is cordoned and drained (evictions honour the PDB), the
// finalizer is stripped, the ignored pod stays, and every node ends Loaded v2 and uncordoned.
func TestRolloutAutomaticWithDrain(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 4, testbed.KernelA)
	ctx := context.Background()
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	}
	one := intstr.FromInt32(1)
	m := tb.VersionedModule("nic", "v1")
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one, Drain: &kmmv1beta1.DrainSpec{
		PodSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-nic"}},
		TimeoutSeconds: 2, PDBForceDrainTimeoutSeconds: 30, IgnoredNamespacePatterns: []string{"^ignored-"},
	}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", tb.Nodes...)
	ignoredNS := "ignored-" + tb.NS
	tb.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ignoredNS}})
	spreadWorkloads(t, tb, ignoredNS)
	watcher := watchOutOfLoaded(t, tb.NS, "nic", tb.Nodes)

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	for _, n := range tb.Nodes {
		tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if cluster.Node(t, n).Spec.Unschedulable {
				return false, n + " is still cordoned"
			}
		}
		return true, ""
	})
	if maxOut, _, left := watcher.result(); maxOut > 1 || left != len(tb.Nodes) {
		t.Fatalf("at most %d nodes out of Loaded at once (want 1), %d nodes seen upgrading (want %d)", maxOut, left, len(tb.Nodes))
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: "stuck"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod held by a finalizer is still there (%v)", err)
	}
	kept := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ignoredNS, Name: "bystander"}, kept); err != nil || kept.DeletionTimestamp != nil {
		t.Errorf("the pod in the ignored namespace was touched: %v", err)
	}
	cluster.AssertEvents(t, tb.NS, "DrainStrippedFinalizers")
}

// spreadWorkloads runs one web replica per node under a PDB of replicas−1, the stuck pod on the
// first node and the bystander on the second.
func spreadWorkloads(t *testing.T, tb *testbed.Bed, ignoredNS string) {
	t.Helper()
	labels := map[string]string{"app": "uses-nic"}
	replicas := int32(len(tb.Nodes))
	tb.Create(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(replicas),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			NodeSelector: map[string]string{tb.Label: "yes"},
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
				WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
			Containers: []corev1.Container{{Name: "web", Image: "reg.example.com/web:1"}},
		}},
	}})
	minAvailable := intstr.FromInt32(replicas - 1)
	tb.Create(&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable, Selector: &metav1.LabelSelector{MatchLabels: labels}}})
	for i, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "stuck", Labels: labels, Finalizers: []string{"kmm.test/hold"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ignoredNS, Name: "bystander", Labels: labels}},
	} {
		p.Spec = corev1.PodSpec{NodeName: tb.Nodes[i], Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/app:1"}}}
		tb.Create(p)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		got := &policyv1.PodDisruptionBudget{}
		_ = k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "web"}, got)
		return got.Status.CurrentHealthy >= replicas, fmt.Sprintf("PDB status %+v", got.Status)
	})
}
