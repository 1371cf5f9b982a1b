package upgrade_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestRolloutAutomatic runs spec.upgradePolicy{automatic, maxUnavailable: 1} over four nodes:
// three start labelled v1, the fourth unlabelled and is adopted by the rollout. After the Module
// moves to v2 the operator moves the version-module labels itself; every node ends Loaded v2 with
// version.ready=v2, and a watch on the NMCs never sees more than one node's pair out of Loaded.
func TestRolloutAutomatic(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 4, testbed.KernelA)
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	for _, n := range tb.Nodes[:3] {
		cluster.SetNodeLabel(t, n, label, "v1")
	}
	one := intstr.FromInt32(1)
	m := tb.VersionedModule("nic", "v1")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:v1"}}
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", tb.Nodes...)
	waitVersionReady(tb, "v1", tb.Nodes...)
	if got := cluster.Node(t, tb.Nodes[3]).Labels[label]; got != "v1" {
		t.Fatalf("the unlabelled node %s was not adopted: version-module label %q, want v1", tb.Nodes[3], got)
	}
	waitDevicePlugins(t, tb.NS, "v1", tb.Nodes...)

	watcher := watchOutOfLoaded(t, tb.NS, "nic", tb.Nodes)
	inv := watchUnloadVersusDevicePlugin(t, tb.NS)
	start := time.Now()
	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")

	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			st := cluster.PairStatus(n, tb.NS, "nic")
			if st == nil || st.State != kmmv1beta1.StateLoaded || st.Config == nil || st.Config.ContainerImage != "reg.example.com/nic:v2" {
				return false, fmt.Sprintf("nic on %s: %s, want Loaded v2", n, testbed.Describe(st))
			}
			if v := cluster.Node(t, n).Labels[kmmv1beta1.VersionReadyLabel(tb.NS, "nic")]; v != "v2" {
				return false, fmt.Sprintf("version.ready on %s is %q, want v2", n, v)
			}
		}
		return true, ""
	})
	t.Logf("rollout of 4 nodes took %v", time.Since(start).Round(time.Millisecond))
	for _, n := range tb.Nodes {
		if got := cluster.Node(t, n).Labels[label]; got != "v2" {
			t.Fatalf("version-module label on %s is %q, want v2 (set by the rollout)", n, got)
		}
		if got := node.Loaded(n)[tb.NS+"/nic"]; got.ContainerImage != "reg.example.com/nic:v2" {
			t.Fatalf("the kernel of %s has %q loaded, want v2", n, got.ContainerImage)
		}
		// Not necessarily through DevicePluginDraining: when the label step's removal of the
		// device plugin label (seed 002, step 2) has the pod gone before the NMC controller sees the
		// version change, the pair unloads straight away; invariant 6 is what must hold.
		cluster.AssertPassedThrough(t, n, tb.NS, fsm.Unloading, fsm.Upgrading, fsm.Loading)
	}
	waitDevicePlugins(t, tb.NS, "v2", tb.Nodes...)
	if v := inv.violations(); len(v) > 0 {
		t.Fatalf("invariant 6 broken: %v", v)
	}
	if inv.unloads() < len(tb.Nodes) {
		t.Fatalf("the watch saw %d unload pods, want at least %d: it is not watching", inv.unloads(), len(tb.Nodes))
	}

	maxOut, events, upgraded := watcher.result()
	t.Logf("NMC watch: %d events, at most %d node(s) out of Loaded at once, %d node(s) seen leaving Loaded", events, maxOut, upgraded)
	if maxOut > 1 {
		t.Fatalf("up to %d nodes were out of Loaded at once, maxUnavailable is 1", maxOut)
	}
	if upgraded != len(tb.Nodes) {
		t.Fatalf("the watch saw %d nodes leave Loaded, want %d: it is not watching", upgraded, len(tb.Nodes))
	}
}

// outOfLoaded watches the NMCs of a test's nodes and records the largest number of nodes whose
// pair of the Module was out of Loaded (or had no status entry) at any observed moment.
type outOfLoaded struct {
	mu      sync.Mutex
	out     map[string]bool
	left    map[string]bool // nodes seen out of Loaded at least once
	max     int
	events  int
	watched map[string]bool
}

func watchOutOfLoaded(t *testing.T, ns, name string, nodes []string) *outOfLoaded {
	t.Helper()
	o := &outOfLoaded{out: map[string]bool{}, left: map[string]bool{}, watched: map[string]bool{}}
	for _, n := range nodes {
		o.watched[n] = true
	}
	testbed.Watch(t, cluster, &kmmv1beta1.NodeModulesConfigList{}, func(et watch.EventType, nmc *kmmv1beta1.NodeModulesConfig) {
		o.observe(et, nmc, ns, name)
	})
	return o
}

func (o *outOfLoaded) observe(t watch.EventType, nmc *kmmv1beta1.NodeModulesConfig, ns, name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.watched[nmc.Name] {
		return
	}
	o.events++
	loaded := false
	for _, st := range nmc.Status.Modules {
		if st.Namespace == ns && st.Name == name {
			loaded = st.State == kmmv1beta1.StateLoaded
		}
	}
	o.out[nmc.Name] = t == watch.Deleted || !loaded
	if o.out[nmc.Name] {
		o.left[nmc.Name] = true
	}
	n := 0
	for _, out := range o.out {
		if out {
			n++
		}
	}
	o.max = max(o.max, n)
}

func (o *outOfLoaded) result() (maxOut, events, left int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.max, o.events, len(o.left)
}
