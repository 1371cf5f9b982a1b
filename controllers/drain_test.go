package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestUpgradeDrain upgrades one node whose workloads use the module: a Deployment under a PDB
// (minAvailable = replicas−1), a pod held by a finalizer, and a pod in an ignored namespace. The
// PDB is honoured until the force timeout, the finalizer is stripped, the ignored pod is left
// alone, the node is cordoned during the drain and uncordoned after, and v2 ends loaded.
func TestUpgradeDrain(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	ctx := context.Background()
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	m := tb.VersionedModule("nic", "v1")
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{
		PodSelector:                 &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-nic"}},
		TimeoutSeconds:              2,
		PDBForceDrainTimeoutSeconds: 4,
		IgnoredNamespacePatterns:    []string{"^ignored-"},
	}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)

	ignoredNS := "ignored-" + tb.NS
	tb.Create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ignoredNS}})
	workloads(t, tb, n, ignoredNS)

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v2")
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return cluster.Node(t, n).Spec.Unschedulable && st != nil && st.Drain != nil, "the node cordoned by the drain: " + testbed.Describe(st)
	})
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	// The reconcile that records Loaded uncordons right after its status write: give it that moment.
	testbed.Eventually(t, 5*time.Second, func() (bool, string) {
		return !cluster.Node(t, n).Spec.Unschedulable, "the node uncordoned after the upgrade"
	})
	cluster.AssertPassedThrough(t, n, tb.NS, fsm.DevicePluginDraining, fsm.Unloading, fsm.Upgrading, fsm.Loading, fsm.Loaded)
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: "stuck"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod held by a finalizer is still there (%v)", err)
	}
	kept := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ignoredNS, Name: "bystander"}, kept); err != nil || kept.DeletionTimestamp != nil {
		t.Errorf("the pod in the ignored namespace was touched: %v %v", err, kept.DeletionTimestamp)
	}
	cluster.AssertEvents(t, tb.NS, "DrainStrippedFinalizers", "DrainDeleted")
}

// workloads creates the drain's targets on node n.
func workloads(t *testing.T, tb *testbed.Bed, n, ignoredNS string) {
	t.Helper()
	labels := map[string]string{"app": "uses-nic"}
	tb.Create(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "web"}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](2),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			NodeSelector: map[string]string{corev1.LabelHostname: n},
			Containers:   []corev1.Container{{Name: "web", Image: "reg.example.com/web:1"}},
		}},
	}})
	minAvailable := intstr.FromInt32(1)
	tb.Create(&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable, Selector: &metav1.LabelSelector{MatchLabels: labels}}})
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "stuck", Labels: labels, Finalizers: []string{"kmm.test/hold"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ignoredNS, Name: "bystander", Labels: labels}},
	} {
		p.Spec = corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/app:1"}}}
		tb.Create(p)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.MatchingLabels(labels))
		running := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == n && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 4, fmt.Sprintf("%d of 4 workload pods running", running)
	})
}

// TestDrainTimeoutGauge: with the escalations disabled, a PodDisruptionBudget that forbids every
// eviction holds the drain past its timeouts; kmm_node_drain_timeout rises for the node, and resets
// once the administrator resolves it (here: removes the PDB) and the upgrade goes on.
func TestDrainTimeoutGauge(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	ctx := context.Background()
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	m := tb.VersionedModule("nic", "v1")
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{
		PodSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-nic"}},
		TimeoutSeconds: 1, PDBForceDrainTimeoutSeconds: 2, DisableDrainStrategies: true,
	}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)
	labels := map[string]string{"app": "uses-nic"}
	tb.Create(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "db", Labels: labels},
		Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "db", Image: "reg.example.com/db:1"}}}})
	minAvailable := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "db"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable, Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	tb.Create(pdb)
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &policyv1.PodDisruptionBudget{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(pdb), got)
		return got.Status.CurrentHealthy == 1 && got.Status.DisruptionsAllowed == 0, fmt.Sprintf("PDB status %+v", got.Status)
	})

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v2")
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		return gauge(t, "kmm_node_drain_timeout", n) == 1, "kmm_node_drain_timeout of " + n + " to rise"
	})
	if st := cluster.PairStatus(n, tb.NS, "nic"); st.State != fsm.DevicePluginDraining {
		t.Fatalf("the pair is %s while its drain is blocked", testbed.Describe(st))
	}
	if err := k8s.Delete(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		return gauge(t, "kmm_node_drain_timeout", n) == 0, "kmm_node_drain_timeout of " + n + " to reset"
	})
}

// gauge reads a gauge of the operator's registry for a node (-1 when absent).
func gauge(t *testing.T, name, node string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" && l.GetValue() == node {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// TestEmptyPodSelectorDrainsOnlyWorkloads: a drain with no podSelector selects every pod on the
// node, yet evicts only the workload. On the node it drains are another Module's running worker pod
// (held by the agent), a third Module's device plugin pod, a DaemonSet's pod and a static pod's
// mirror: none is evicted or deleted, and the upgrade ends with v2 loaded (issue 34: the other
// Module's worker pod was evicted).
func TestEmptyPodSelectorDrainsOnlyWorkloads(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	ctx := context.Background()

	gpu := tb.Module("gpu")
	gpu.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/gpu-dp:1"}}
	tb.Create(gpu)
	tb.WaitLoaded("gpu", "reg.example.com/gpu:a", n)

	node.SetHold(func(p *corev1.Pod) bool { return p.Namespace == tb.NS && p.Labels[contract.LabelModuleName] == "fw" })
	t.Cleanup(func() { node.SetHold(nil) })
	tb.Create(tb.Module("fw"))

	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	nic := tb.VersionedModule("nic", "v1")
	nic.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{TimeoutSeconds: 2, PDBForceDrainTimeoutSeconds: 4}}
	tb.Create(nic)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)

	onNode := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.NodeName = n
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: "reg.example.com/app:1"}}
		return p
	}
	tb.Create(onNode(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "app"}}))
	tb.Create(onNode(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "static-" + n,
		Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "0123456789abcdef"}}}))
	dsLabels := map[string]string{"app": "node-agent"}
	tb.Create(&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "node-agent"}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: dsLabels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: dsLabels}, Spec: corev1.PodSpec{
			NodeSelector: map[string]string{corev1.LabelHostname: n},
			Containers:   []corev1.Container{{Name: "agent", Image: "reg.example.com/agent:1"}},
		}},
	}})

	// spared are the pods the drain must leave alone, by name, once each is Running.
	spared := map[string]types.UID{}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		if err := k8s.List(ctx, pods, client.InNamespace(tb.NS)); err != nil {
			return false, err.Error()
		}
		clear(spared)
		for _, p := range pods.Items {
			if p.Spec.NodeName != n || p.Status.Phase != corev1.PodRunning {
				continue
			}
			switch {
			case p.Labels[contract.LabelWorker] == "true" && p.Labels[contract.LabelModuleName] == "fw",
				p.Labels[contract.LabelDevicePlugin] == "true" && p.Labels[contract.LabelModuleName] == "gpu",
				p.Labels["app"] == "node-agent", p.Name == "static-"+n:
				spared[p.Name] = p.UID
			}
		}
		return len(spared) == 4, fmt.Sprintf("running: %v, want fw's worker, gpu's device plugin, the DaemonSet's and the mirror pod", spared)
	})

	// Every deletion of a spared pod (an eviction sets its deletion timestamp) is seen as it happens.
	var mu sync.Mutex
	var touched []string
	testbed.Watch(t, cluster, &corev1.PodList{}, func(ev watch.EventType, p *corev1.Pod) {
		mu.Lock()
		defer mu.Unlock()
		if uid, ok := spared[p.Name]; ok && uid == p.UID && (ev == watch.Deleted || p.DeletionTimestamp != nil) && !slices.Contains(touched, p.Name) {
			touched = append(touched, p.Name)
		}
	}, client.InNamespace(tb.NS))
	touchedPods := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(touched)
	}

	cluster.BumpVersion(t, nic, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v2")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		done := st != nil && st.State == kmmv1beta1.StateLoaded && st.Config != nil && st.Config.ContainerImage == "reg.example.com/nic:v2"
		return done || len(touchedPods()) > 0, "nic loaded with v2: " + testbed.Describe(st)
	})
	if got := touchedPods(); len(got) > 0 {
		t.Fatalf("the drain evicted or deleted %v, which it must never touch", got)
	}
	cluster.AssertPassedThrough(t, n, tb.NS, fsm.DevicePluginDraining, fsm.Unloading, fsm.Upgrading, fsm.Loading, fsm.Loaded)
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: "app"}, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("the workload pod is still there (%v)", err)
	}
	for name, uid := range spared {
		p := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: name}, p); err != nil || p.UID != uid || p.DeletionTimestamp != nil {
			t.Errorf("pod %s: %v, uid %s (was %s), deletion %v: want it untouched", name, err, p.UID, uid, p.DeletionTimestamp)
		}
	}
}
