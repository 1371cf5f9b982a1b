package upgrade_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestDRAOrderedUpgradeUnderClaim: a versioned Module with spec.dra runs its driver DaemonSet and
// DeviceClass, the node gets dra-ready; an ordered upgrade v1→v2 with an allocated ResourceClaim of
// the driver on the node waits in DevicePluginDraining (reason ClaimsAllocated, an Event) with the
// v1 driver kept and no unload pod, until the claim is released; the upgrade drain then evicts the
// v1 driver pod (Eviction API: DisruptionTarget), and only after it is gone the unload runs; v2's
// driver comes after v2 is loaded.
func TestDRAOrderedUpgradeUnderClaim(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	w := watchDRA(t, tb.NS)
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	cluster.SetNodeLabel(t, n, label, "v1")
	class := tb.NS + ".gpu.example.com"
	m := tb.VersionedModule("nic", "v1")
	m.Spec.DRA = &kmmv1beta1.DRASpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dra:v1"},
		DriverName: "gpu.example.com", DeviceClasses: []kmmv1beta1.DeviceClassSpec{{Name: class,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}}}
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-gpu"}}, TimeoutSeconds: 600, PDBForceDrainTimeoutSeconds: 900}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)
	waitDRADriver(t, tb.NS, "nic-dra-v1", n)
	waitLabel(t, n, kmmv1beta1.DRAReadyLabel(tb.NS, "nic"), true)
	dc := &resourcev1.DeviceClass{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: class}, dc); err != nil {
		t.Fatalf("the Module's DeviceClass: %v", err)
	}
	if dc.Labels[contract.LabelModuleName] != "nic" || len(dc.Spec.Selectors) != 1 {
		t.Fatalf("DeviceClass %+v: want kmm's labels of the Module and its selector", dc.ObjectMeta)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		_ = k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got)
		return got.Status.DRA.AvailableNumber == 1, fmt.Sprintf("status.dra %+v", got.Status.DRA)
	})

	claim := allocateClaim(t, tb.NS, n, class)
	w.setClaim(true)
	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, label, "v2")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return st != nil && st.State == fsm.DevicePluginDraining && st.Reason == string(fsm.ClaimsAllocated),
			fmt.Sprintf("the pair waiting for the claim, it is %+v", st)
	})
	cluster.AssertEvents(t, tb.NS, string(fsm.ClaimsAllocated))
	if !w.driverOn(n, "nic-dra-v1") {
		t.Fatalf("the v1 DRA driver left while a claim of its devices is allocated")
	}

	w.setClaim(false) // before the write: the operator may act on it at once
	releaseClaim(t, claim)
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	waitDRADriver(t, tb.NS, "nic-dra-v2", n)
	waitLabel(t, n, kmmv1beta1.DRAReadyLabel(tb.NS, "nic"), true)
	if v := w.violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if !w.evicted() {
		t.Fatalf("the v1 DRA driver pod was not evicted by the upgrade drain")
	}
	if w.unloads() == 0 {
		t.Fatalf("the watch saw no unload pod: it is not watching")
	}
}

// TestDRADeleteUnderClaim: a Module with spec.dra deleted while a ResourceClaim of its driver is
// allocated on the node keeps its driver pod there (the kubelet needs it to unprepare the claim) and
// unloads nothing until the claim is released; then the driver goes, the module is unloaded, the
// Module and its DaemonSet are gone.
func TestDRADeleteUnderClaim(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	w := watchDRA(t, tb.NS)
	class := tb.NS + ".gpu.example.com"
	m := tb.Module("nic")
	m.Spec.DRA = &kmmv1beta1.DRASpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dra:1"},
		DriverName: "gpu.example.com", DeviceClasses: []kmmv1beta1.DeviceClassSpec{{Name: class}}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)
	waitDRADriver(t, tb.NS, "nic-dra", n)

	claim := allocateClaim(t, tb.NS, n, class)
	w.setClaim(true)
	if err := k8s.Delete(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return st != nil && st.State == fsm.DevicePluginDraining && st.Reason == string(fsm.ClaimsAllocated),
			fmt.Sprintf("the pair waiting for the claim, it is %+v", st)
	})
	// The DaemonSet controller acts within a second of a change: give the operator's reconciles of
	// the deletion (the Module's and the node's) a claim poll to take the driver away if they would.
	for end := time.Now().Add(fsm.ClaimsPoll + time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !w.driverOn(n, "nic-dra") {
			t.Fatalf("the DRA driver left while a claim of its devices is allocated; violations %v", w.violations())
		}
	}

	w.setClaim(false)
	releaseClaim(t, claim)
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), &kmmv1beta1.Module{})
		return apierrors.IsNotFound(err), fmt.Sprintf("the Module: %v", err)
	})
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		list := &appsv1.DaemonSetList{}
		_ = k8s.List(context.Background(), list, client.InNamespace(tb.NS))
		return len(list.Items) == 0, fmt.Sprintf("%d DaemonSets left", len(list.Items))
	})
	if v := w.violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if w.unloads() == 0 {
		t.Fatalf("the watch saw no unload pod: it is not watching")
	}
}

// allocateClaim makes a ResourceClaim for class allocated on node with a device of gpu.example.com,
// as the scheduler would.
func allocateClaim(t *testing.T, ns, node, class string) *resourcev1.ResourceClaim {
	t.Helper()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu-claim", Finalizers: []string{resourcev1.Finalizer}},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class}}}}}}
	if err := k8s.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.example.com", Pool: node, Device: "gpu0"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	if err := k8s.Status().Update(context.Background(), c); err != nil {
		t.Fatalf("allocating the claim: %v", err)
	}
	return c
}

// releaseClaim deallocates the claim, as the resource claim controller does once no pod uses it.
func releaseClaim(t *testing.T, c *resourcev1.ResourceClaim) {
	t.Helper()
	c.Status.Allocation = nil
	if err := k8s.Status().Update(context.Background(), c); err != nil {
		t.Fatalf("releasing the claim: %v", err)
	}
}

func waitDRADriver(t *testing.T, ns, ds, node string) {
	t.Helper()
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{contract.LabelDRA: "true"})
		for _, p := range pods.Items {
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.Labels["kmm.sigs.x-k8s.io/daemonset"] == ds {
				return true, ""
			}
		}
		return false, "a running " + ds + " pod on " + node
	})
}

func waitLabel(t *testing.T, node, key string, present bool) {
	t.Helper()
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		_, has := cluster.Node(t, node).Labels[key]
		return has == present, fmt.Sprintf("label %s present=%v on %s", key, present, node)
	})
}

// draWatch watches a namespace's pods: an unload pod while the Module's DRA driver pod is on the
// node, or while the test holds an allocated claim, is a violation; a DRA driver pod that leaves
// while the claim is allocated too. It records whether a driver pod was evicted.
type draWatch struct {
	mu       sync.Mutex
	claim    bool
	drivers  map[string]string // pod UID → node/daemonset
	viols    []string
	nUnloads int
	eviction bool
}

func watchDRA(t *testing.T, ns string) *draWatch {
	t.Helper()
	w := &draWatch{drivers: map[string]string{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, w.observe, client.InNamespace(ns))
	return w
}

func (w *draWatch) setClaim(held bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.claim = held
}

func (w *draWatch) observe(t watch.EventType, p *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case p.Labels[contract.LabelDRA] != "":
		gone := t == watch.Deleted || p.DeletionTimestamp != nil
		for _, c := range p.Status.Conditions {
			w.eviction = w.eviction || (c.Type == corev1.DisruptionTarget && c.Reason == "EvictionByEvictionAPI")
		}
		if gone {
			if _, ok := w.drivers[string(p.UID)]; ok && w.claim {
				w.viols = append(w.viols, "DRA driver pod "+p.Name+" leaves under an allocated claim")
			}
			delete(w.drivers, string(p.UID))
		} else if p.Spec.NodeName != "" {
			w.drivers[string(p.UID)] = p.Spec.NodeName + "/" + p.Labels["kmm.sigs.x-k8s.io/daemonset"]
		}
	case p.Labels[contract.LabelAction] == "unload" && t != watch.Deleted && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed:
		w.nUnloads++
		if w.claim {
			w.viols = append(w.viols, "unload pod "+p.Name+" under an allocated claim")
		}
		for _, d := range w.drivers {
			if strings.HasPrefix(d, p.Spec.NodeName+"/") {
				w.viols = append(w.viols, "unload pod "+p.Name+" beside DRA driver "+d)
			}
		}
	}
}

func (w *draWatch) driverOn(node, ds string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.drivers {
		if d == node+"/"+ds {
			return true
		}
	}
	return false
}

func (w *draWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.viols...)
}

func (w *draWatch) unloads() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nUnloads
}

func (w *draWatch) evicted() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.eviction
}
