package upgrade_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestOrderedUpgrade follows seed 002 over three nodes: node 0 by the manual steps (remove the
// version label, then set the new one), nodes 1 and 2 by the shortcut (change the label's value).
// At every observed moment no unload pod runs while that node's device plugin pod exists,
// version.ready moves node by node, and the other nodes keep v1 loaded until their turn.
func TestOrderedUpgrade(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	inv := watchUnloadVersusDevicePlugin(t, tb.NS)
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, label, "v1")
	}
	m := tb.VersionedModule("nic", "v1")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:v1"}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", tb.Nodes...)
	waitDevicePlugins(t, tb.NS, "v1", tb.Nodes...)
	waitVersionReady(tb, "v1", tb.Nodes...)

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")

	// Node 0, manual: remove the label (unload), then set v2.
	cluster.SetNodeLabel(t, tb.Nodes[0], label, "")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		_, loaded := node.Loaded(tb.Nodes[0])[tb.NS+"/nic"]
		return !loaded && cluster.PairStatus(tb.Nodes[0], tb.NS, "nic") == nil, "the module unloaded from " + tb.Nodes[0]
	})
	assertStillV1(tb, tb.Nodes[1:]...)
	cluster.SetNodeLabel(t, tb.Nodes[0], label, "v2")
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", tb.Nodes[0])
	waitVersionReady(tb, "v2", tb.Nodes[0])
	waitDevicePlugins(t, tb.NS, "v2", tb.Nodes[0])
	assertStillV1(tb, tb.Nodes[1:]...)

	// Nodes 1 and 2, shortcut: change the label's value.
	for i, n := range tb.Nodes[1:] {
		cluster.SetNodeLabel(t, n, label, "v2")
		tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
		waitVersionReady(tb, "v2", n)
		assertStillV1(tb, tb.Nodes[i+2:]...)
		// DevicePluginDraining only when the NMC controller sees the label move before the device
		// plugin pod is gone (TestRolloutAutomatic); inv checks invariant 6 either way.
		cluster.AssertPassedThrough(t, n, tb.NS, fsm.Unloading, fsm.Upgrading, fsm.Loading)
	}
	waitDevicePlugins(t, tb.NS, "v2", tb.Nodes...)
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		old := &appsv1.DaemonSet{}
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "nic-device-plugin-v1"}, old)
		return err != nil, "the v1 device plugin DaemonSet to be deleted once no node needs it"
	})
	if v := inv.violations(); len(v) > 0 {
		t.Fatalf("invariant 6 broken: %v", v)
	}
	if inv.unloads() < 3 {
		t.Fatalf("the watch saw %d unload pods, want at least 3: it is not watching", inv.unloads())
	}
}

func waitVersionReady(tb *testbed.Bed, version string, nodes ...string) {
	tb.T.Helper()
	key := kmmv1beta1.VersionReadyLabel(tb.NS, "nic")
	testbed.Eventually(tb.T, 30*time.Second, func() (bool, string) {
		for _, n := range nodes {
			if got := cluster.Node(tb.T, n).Labels[key]; got != version {
				return false, fmt.Sprintf("version.ready on %s is %q, want %s", n, got, version)
			}
		}
		return true, ""
	})
}

func assertStillV1(tb *testbed.Bed, nodes ...string) {
	tb.T.Helper()
	for _, n := range nodes {
		if got := node.Loaded(n)[tb.NS+"/nic"]; got.ContainerImage != "reg.example.com/nic:v1" {
			tb.T.Fatalf("node %s has %q loaded before its turn, want v1", n, got.ContainerImage)
		}
		if v := cluster.Node(tb.T, n).Labels[kmmv1beta1.VersionReadyLabel(tb.NS, "nic")]; v != "v1" {
			tb.T.Fatalf("version.ready on %s is %q before its turn", n, v)
		}
	}
}

// waitDevicePlugins waits for a Running device plugin pod of the given version on each node.
func waitDevicePlugins(t *testing.T, ns, version string, nodes ...string) {
	t.Helper()
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{contract.LabelDevicePlugin: "true"})
		for _, n := range nodes {
			found := false
			for _, p := range pods.Items {
				ds := p.Labels["kmm.sigs.x-k8s.io/daemonset"]
				found = found || (p.Spec.NodeName == n && p.Status.Phase == corev1.PodRunning && ds == "nic-device-plugin-"+version)
			}
			if !found {
				return false, fmt.Sprintf("a running %s device plugin pod on %s", version, n)
			}
		}
		return true, ""
	})
}

// unloadVsDevicePlugin watches a namespace's pods and records every moment an unload pod and the
// same node's device plugin pod of the same Module exist together.
type unloadVsDevicePlugin struct {
	mu       sync.Mutex
	unload   map[string]string // pod UID → node/module
	dp       map[string]string
	viols    []string
	nUnloads int
}

func watchUnloadVersusDevicePlugin(t *testing.T, ns string) *unloadVsDevicePlugin {
	t.Helper()
	u := &unloadVsDevicePlugin{unload: map[string]string{}, dp: map[string]string{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, u.observe, client.InNamespace(ns))
	return u
}

func (u *unloadVsDevicePlugin) observe(t watch.EventType, p *corev1.Pod) {
	u.mu.Lock()
	defer u.mu.Unlock()
	pair := p.Spec.NodeName + "/" + p.Labels[contract.LabelModuleName]
	isUnload := p.Labels[contract.LabelAction] == "unload"
	if !isUnload && p.Labels[contract.LabelDevicePlugin] == "" {
		return
	}
	set := u.dp
	if isUnload {
		set = u.unload
	}
	finished := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	if t == watch.Deleted || (finished && isUnload) || p.Spec.NodeName == "" {
		delete(set, string(p.UID))
		return
	}
	if _, seen := set[string(p.UID)]; !seen && isUnload {
		u.nUnloads++
	}
	set[string(p.UID)] = pair
	plugins := mapsValues(u.dp)
	for _, x := range mapsValues(u.unload) {
		if slices.Contains(plugins, x) {
			u.viols = append(u.viols, "unload pod and device plugin pod together on "+x)
		}
	}
}

func mapsValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func (u *unloadVsDevicePlugin) violations() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.viols...)
}

func (u *unloadVsDevicePlugin) unloads() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.nUnloads
}
