package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestLoadOnThreeNodes: all pairs Loaded, ready labels, status 3/3/3 and Ready, device plugin DaemonSet.
func TestLoadOnThreeNodes(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	m := tb.Module("nic")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"}}
	tb.Create(m)

	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	for _, n := range tb.Nodes {
		if _, ok := cluster.Node(t, n).Labels[kmmv1beta1.ReadyLabel(tb.NS, "nic")]; !ok {
			t.Errorf("node %s lacks the ready label", n)
		}
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			return false, err.Error()
		}
		s := got.Status.ModuleLoader
		ready := meta.IsStatusConditionTrue(got.Status.Conditions, kmmv1beta1.ConditionReady)
		return s.NodesMatchingSelectorNumber == 3 && s.DesiredNumber == 3 && s.AvailableNumber == 3 && ready &&
				got.Status.NodesByState[kmmv1beta1.StateLoaded] == 3,
			fmt.Sprintf("status %+v conditions %+v", got.Status.ModuleLoader, got.Status.Conditions)
	})
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: module.DevicePluginName(m)}, ds); err != nil {
		t.Fatalf("device plugin DaemonSet: %v", err)
	}
	if _, ok := ds.Spec.Template.Spec.NodeSelector[kmmv1beta1.ReadyLabel(tb.NS, "nic")]; !ok || ds.Spec.Template.Spec.Containers[0].Image != "reg.example.com/nic-dp:1" {
		t.Fatalf("device plugin DaemonSet selects %v with image %s", ds.Spec.Template.Spec.NodeSelector, ds.Spec.Template.Spec.Containers[0].Image)
	}
	for _, n := range tb.Nodes {
		if c := node.RunCount(n, tb.NS+"/nic"); c != 1 {
			t.Errorf("node %s ran %d worker pods for one load, want 1", n, c)
		}
	}
	assertMetric(t, "kmm_transitions_total", "Loading", "Loaded", "WorkerSucceeded")
	assertMetric(t, "kmm_pairs", tb.NS, "nic", "Loaded")
	assertMetric(t, "kmm_worker_pod_duration_seconds", "load", "Succeeded")
	assertLoadEvents(t, tb, m)
}

// assertLoadEvents checks where the Events of a load went (issue 22: Events off the happy path):
// no Event per node, one aggregated Event (a series) per transition kind on the Module, and its own
// AllLoaded Event; every node's Loading -> Loaded is in its NMC's transition log.
func assertLoadEvents(t *testing.T, tb *testbed.Bed, m *kmmv1beta1.Module) {
	t.Helper()
	var moduleEvents *eventsv1.EventList
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		moduleEvents = &eventsv1.EventList{}
		_ = k8s.List(context.Background(), moduleEvents, client.InNamespace(tb.NS))
		kinds := map[string]bool{}
		for _, e := range moduleEvents.Items {
			if e.Regarding.Kind == "Module" && e.Regarding.Name == m.Name && e.Type == corev1.EventTypeNormal {
				kinds[e.Reason+"/"+e.Action] = true
			}
		}
		return kinds["SpecSet/ToLoading"] && kinds["WorkerSucceeded/ToLoaded"] && kinds[kmmv1beta1.ReasonAllLoaded+"/StateChanged"],
			fmt.Sprintf("Normal Events on the Module: %v", kinds)
	})
	perKind := map[string]int{}
	for _, e := range moduleEvents.Items {
		if e.Regarding.Kind == "Module" && e.Regarding.Name == m.Name {
			perKind[e.Reason+"/"+e.Action]++
		}
	}
	for kind, n := range perKind {
		if n != 1 {
			t.Errorf("%d Events %s on the Module for %d nodes, want one (a series)", n, kind, len(tb.Nodes))
		}
	}
	nmcEvents := &eventsv1.EventList{}
	_ = k8s.List(context.Background(), nmcEvents, client.InNamespace(metav1.NamespaceDefault))
	for _, e := range nmcEvents.Items {
		if e.Regarding.Kind == "NodeModulesConfig" && e.Related != nil && e.Related.Name == m.Name && e.Related.Namespace == tb.NS {
			t.Errorf("a per-node Event on the happy path: %s %s %s", e.Regarding.Name, e.Reason, e.Note)
		}
	}
	for _, n := range tb.Nodes {
		nmc := &kmmv1beta1.NodeModulesConfig{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Name: n}, nmc); err != nil {
			t.Fatal(err)
		}
		st, logged := nmc.StatusEntry(tb.NS, m.Name), false
		for _, tr := range st.Transitions {
			logged = logged || (tr.From == kmmv1beta1.StateLoading && tr.To == kmmv1beta1.StateLoaded && tr.Trigger == string(fsm.WorkerSucceeded))
		}
		if !logged {
			t.Errorf("node %s: no Loading -> Loaded in the NMC's transition log %+v", n, st.Transitions)
		}
	}
}

// assertMetric checks that the operator's registry has a positive sample of the metric with every
// given label value.
func assertMetric(t *testing.T, name string, values ...string) {
	t.Helper()
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		families, err := metrics.Registry.Gather()
		if err != nil {
			return false, err.Error()
		}
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := m.String()
				ok := m.GetGauge().GetValue() > 0 || m.GetCounter().GetValue() > 0 || m.GetHistogram().GetSampleCount() > 0
				for _, v := range values {
					ok = ok && strings.Contains(labels, `"`+v+`"`)
				}
				if ok {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("a sample of %s with %v", name, values)
	})
}

// TestKernelUpgradeLoadsTheNewMappingAndUnmappedKernelIsReported.
func TestKernelUpgradeLoadsTheNewMappingAndUnmappedKernelIsReported(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	tb.AddNode(tb.Nodes[0]+"-old", "4.18.0-1.el8.x86_64")
	tb.Create(tb.Module("nic"))
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes[0])

	if err := node.SetKernel(context.Background(), tb.Nodes[0], testbed.KernelB); err != nil {
		t.Fatal(err)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:b-6.1.0", tb.Nodes[0])

	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		_ = k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "nic"}, got)
		c := meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionDegraded)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == kmmv1beta1.ReasonNoKernelMapping && strings.Contains(c.Message, tb.Nodes[1]),
			fmt.Sprintf("Degraded condition %+v", c)
	})
	if st := cluster.PairStatus(tb.Nodes[1], tb.NS, "nic"); st != nil && st.State != kmmv1beta1.StateAbsent {
		t.Fatalf("the unmapped node has state %s", testbed.Describe(st))
	}
	if len(workerPodsOn(t, tb.Nodes[1])) != 0 || node.RunCount(tb.Nodes[1], tb.NS+"/nic") != 0 {
		t.Fatal("a worker pod ran on the node without a kernel mapping")
	}
}

// TestRebootReloads: a new boot ID reloads the module.
func TestRebootReloads(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	tb.Create(tb.Module("nic"))
	n := tb.Nodes[0]
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)

	if err := node.Reboot(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	if _, ok := node.Loaded(n)[tb.NS+"/nic"]; ok {
		t.Fatal("the agent still has the module loaded after a reboot")
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)
	if st := cluster.PairStatus(n, tb.NS, "nic"); st.BootID != node.BootID(n) {
		t.Fatalf("status boot ID %s, node boot ID %s", st.BootID, node.BootID(n))
	}
	if c := node.RunCount(n, tb.NS+"/nic"); c != 2 {
		t.Fatalf("%d worker runs, want 2 (load, reload)", c)
	}
}

// TestNotReadyNodeGetsNoWorkerPod: rule 1 of seed 000.
func TestNotReadyNodeGetsNoWorkerPod(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	if err := node.SetReady(context.Background(), n, false); err != nil {
		t.Fatal(err)
	}
	tb.Create(tb.Module("nic"))
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		nmc := &kmmv1beta1.NodeModulesConfig{}
		err := k8s.Get(context.Background(), client.ObjectKey{Name: n}, nmc)
		return err == nil && len(nmc.Spec.Modules) == 1, "the NMC spec entry of the NotReady node"
	})
	time.Sleep(2 * time.Second) // give the NMC controller time to do the wrong thing
	if pods := workerPodsOn(t, n); len(pods) != 0 {
		t.Fatalf("worker pod %s created on a NotReady node", pods[0].Name)
	}
	if err := node.SetReady(context.Background(), n, true); err != nil {
		t.Fatal(err)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)
}

// TestWorkerFailureBacksOffAndFixingTheImageRecovers.
func TestWorkerFailureBacksOffAndFixingTheImageRecovers(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	m := tb.Module("nic")
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/nic:broken"
	tb.Create(m)

	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return st != nil && st.Attempts >= 2, "two failed attempts: " + testbed.Describe(cluster.PairStatus(n, tb.NS, "nic"))
	})
	st := cluster.PairStatus(n, tb.NS, "nic")
	if st.Reason != "ImagePull" || !strings.Contains(st.Message, "MANIFEST_UNKNOWN") {
		t.Errorf("status reason %q, message %q: the failure class is not given as data", st.Reason, st.Message)
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		_ = k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got)
		c := meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionDegraded)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == kmmv1beta1.ReasonWorkerFailing, fmt.Sprintf("Degraded %+v", c)
	})
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		evs := &eventsv1.EventList{}
		_ = k8s.List(context.Background(), evs, client.InNamespace(tb.NS))
		for _, e := range evs.Items {
			if e.Reason == "ImagePull" && e.Type == corev1.EventTypeWarning && e.Regarding.Name == "nic" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("a Warning Event ImagePull on the Module among %d events", len(evs.Items))
	})

	setFirstImage(t, m, "reg.example.com/nic:fixed")
	tb.WaitLoaded("nic", "reg.example.com/nic:fixed", n)
	if st := cluster.PairStatus(n, tb.NS, "nic"); st.Attempts != 0 {
		t.Fatalf("attempts %d after a success, want 0", st.Attempts)
	}
}

// TestModuleDeletionUnloadsEverywhereAndLeavesNothing.
func TestModuleDeletionUnloadsEverywhereAndLeavesNothing(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	m := tb.Module("nic")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)

	v := tb.VersionedModule("gpu", "v1")
	tb.Create(v)
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "gpu"), "v1")
	}
	tb.WaitLoaded("gpu", "reg.example.com/gpu:v1", tb.Nodes...)

	for _, obj := range []client.Object{m, v} {
		if err := k8s.Delete(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), &kmmv1beta1.Module{})
		err2 := k8s.Get(context.Background(), client.ObjectKeyFromObject(v), &kmmv1beta1.Module{})
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(err2), "the Modules to be gone (finalizers released)"
	})
	// The last transition of each pair (it leaves the NMC status) has its Event too (issue 13: the
	// controller panicked on it), and the internal version labels go with the versioned Module.
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		evs := &eventsv1.EventList{}
		_ = k8s.List(context.Background(), evs, client.InNamespace(metav1.NamespaceDefault))
		gone := map[string]bool{}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "NodeModulesConfig" && e.Related != nil && e.Related.Namespace == tb.NS && e.Related.Name == "nic" &&
				strings.Contains(e.Note, "Unloading -> Absent") {
				gone[e.Regarding.Name] = true
			}
		}
		labelsLeft := []string{}
		for _, n := range tb.Nodes {
			for k := range cluster.Node(t, n).Labels {
				if strings.Contains(k, tb.NS+".gpu") && !strings.Contains(k, "version-module") {
					labelsLeft = append(labelsLeft, n+":"+k)
				}
			}
		}
		return len(gone) == len(tb.Nodes) && len(labelsLeft) == 0,
			fmt.Sprintf("Unloading -> Absent Events on %v; internal labels left %v", gone, labelsLeft)
	})
	for _, n := range tb.Nodes {
		if _, ok := node.Loaded(n)[tb.NS+"/nic"]; ok {
			t.Errorf("still loaded on %s", n)
		}
		for k := range cluster.Node(t, n).Labels {
			if strings.Contains(k, tb.NS+".nic") || strings.Contains(k, "version-worker-pod."+tb.NS+".gpu") || strings.Contains(k, "version-schedule-pod."+tb.NS+".gpu") || strings.Contains(k, "version-device-plugin."+tb.NS+".gpu") {
				t.Errorf("node %s keeps label %s", n, k)
			}
		}
		if st := cluster.PairStatus(n, tb.NS, "nic"); st != nil {
			t.Errorf("NMC of %s keeps %s", n, testbed.Describe(st))
		}
		if runs := unloadRuns(n, tb.NS+"/nic"); runs != 1 {
			t.Errorf("%d unload runs on %s, want 1", runs, n)
		}
	}
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		list := &appsv1.DaemonSetList{}
		_ = k8s.List(context.Background(), list, client.InNamespace(tb.NS))
		pods := &corev1.PodList{}
		_ = k8s.List(context.Background(), pods, client.InNamespace(tb.NS))
		return len(list.Items) == 0 && len(pods.Items) == 0, fmt.Sprintf("%d DaemonSets and %d pods left", len(list.Items), len(pods.Items))
	})
}

func unloadRuns(n, module string) int {
	c := 0
	for _, r := range node.Runs() {
		if r.Node == n && r.Module == module && r.Action == "unload" {
			c++
		}
	}
	return c
}

// TestConcurrentModulesKeepEachOthersEntries edits two Modules at once on the same nodes and
// checks every NMC revision: once both entries are there, neither ever disappears.
func TestConcurrentModulesKeepEachOthersEntries(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	revisions := watchNMCs(t, tb.Nodes)
	for _, name := range []string{"alpha", "beta"} {
		tb.Create(tb.Module(name))
	}
	var wg sync.WaitGroup
	for _, name := range []string{"alpha", "beta"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				setImage(t, tb.NS, name, fmt.Sprintf("reg.example.com/%s:v%d", name, i))
			}
		}()
	}
	wg.Wait()
	tb.WaitLoaded("alpha", "reg.example.com/alpha:v4", tb.Nodes...)
	tb.WaitLoaded("beta", "reg.example.com/beta:v4", tb.Nodes...)
	for n, revs := range revisions.snapshot() {
		both := false
		for _, entries := range revs {
			has := entries[tb.NS+"/alpha"] && entries[tb.NS+"/beta"]
			if both && !has {
				t.Fatalf("an NMC revision of %s lost an entry: %v", n, entries)
			}
			both = both || has
		}
		if !both || len(revs) < 2 {
			t.Fatalf("watched %d revisions of %s, never with both entries", len(revs), n)
		}
	}
}

func setImage(t *testing.T, ns, name, image string) {
	t.Helper()
	editModule(t, client.ObjectKey{Namespace: ns, Name: name}, func(m *kmmv1beta1.Module) {
		m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = image
	})
}

// editModule applies edit to the Module as an administrator's edit does: read, change, update,
// again on a conflict. The operator writes the Module's status and finalizers while a test runs,
// so a lone Get and Update fails whenever one of those lands in between. It returns the Module as
// updated.
func editModule(t *testing.T, key client.ObjectKey, edit func(*kmmv1beta1.Module)) *kmmv1beta1.Module {
	t.Helper()
	m := &kmmv1beta1.Module{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(context.Background(), key, m); err != nil {
			return err
		}
		edit(m)
		return k8s.Update(context.Background(), m)
	})
	if err != nil {
		t.Fatalf("editing Module %s: %v", key, err)
	}
	return m
}

// nmcRevisions records the spec entries of every revision of the watched NMCs.
type nmcRevisions struct {
	mu   sync.Mutex
	revs map[string][]map[string]bool
}

func (r *nmcRevisions) snapshot() map[string][]map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]map[string]bool{}
	for k, v := range r.revs {
		out[k] = append([]map[string]bool(nil), v...)
	}
	return out
}

func watchNMCs(t *testing.T, nodes []string) *nmcRevisions {
	t.Helper()
	want := map[string]bool{}
	for _, n := range nodes {
		want[n] = true
	}
	r := &nmcRevisions{revs: map[string][]map[string]bool{}}
	testbed.Watch(t, cluster, &kmmv1beta1.NodeModulesConfigList{}, func(_ watch.EventType, nmc *kmmv1beta1.NodeModulesConfig) {
		if !want[nmc.Name] {
			return
		}
		entries := map[string]bool{}
		for _, e := range nmc.Spec.Modules {
			entries[e.Namespace+"/"+e.Name] = true
		}
		r.mu.Lock()
		r.revs[nmc.Name] = append(r.revs[nmc.Name], entries)
		r.mu.Unlock()
	})
	return r
}

// TestOperatorRestartMidLoad stops the operator while load pods run and starts a new one: no
// second worker pod for any pair, and every pair converges.
func TestOperatorRestartMidLoad(t *testing.T) {
	op := cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	var hold sync.Map
	hold.Store("on", true)
	node.SetHold(func(p *corev1.Pod) bool {
		_, on := hold.Load("on")
		return on && p.Namespace == tb.NS
	})
	t.Cleanup(func() { node.SetHold(nil) })
	tb.Create(tb.Module("nic"))
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if len(workerPodsOn(t, n)) != 1 {
				return false, "a running load pod on " + n
			}
		}
		return true, ""
	})
	op.Stop()
	cluster.StartOperator(t)
	time.Sleep(2 * time.Second) // the new operator sees the running pods and must not add any
	hold.Delete("on")
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	for _, n := range tb.Nodes {
		if c := node.RunCount(n, tb.NS+"/nic"); c != 1 {
			t.Errorf("%d worker runs on %s across the restart, want 1", c, n)
		}
	}
}
