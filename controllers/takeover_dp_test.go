package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// Upstream KMM's names for its device plugin (docs/migration.md): pods and DaemonSet labelled with
// the Module's name, pods holding its node-labeler finalizer.
const (
	upstreamModuleLabel    = "kmm.node.kubernetes.io/module.name"
	upstreamNodeLabelerFin = "kmm.node.kubernetes.io/node-labeler"
)

// leaveUpstreamDevicePlugin creates the device plugin DaemonSet upstream KMM runs for a Module at
// version: generated name, upstream's labels, node selector on the ready and version-schedule-pod
// labels (upstream's current name), pods holding upstream's finalizer. Its controller reference to the Module is set by
// ownUpstreamDevicePlugin once the Module exists.
func leaveUpstreamDevicePlugin(t *testing.T, tb *testbed.Bed, name, version string) *appsv1.DaemonSet {
	t.Helper()
	labels := map[string]string{upstreamModuleLabel: name}
	selector := map[string]string{kmmv1beta1.ReadyLabel(tb.NS, name): ""}
	image := "reg.example.com/" + name + "-dp:1"
	if version != "" {
		labels[kmmv1beta1.DevicePluginVersionLabel(tb.NS, name)] = version
		selector[kmmv1beta1.DevicePluginVersionLabel(tb.NS, name)] = version
		image = "reg.example.com/" + name + "-dp:" + version
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, GenerateName: name + "-device-plugin-", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Finalizers: []string{upstreamNodeLabelerFin}},
				Spec: corev1.PodSpec{
					NodeSelector: selector,
					Containers:   []corev1.Container{{Name: "device-plugin", Image: image}},
				},
			},
		},
	}
	if err := k8s.Create(context.Background(), ds, client.FieldOwner(upstreamManager)); err != nil {
		t.Fatal(err)
	}
	return ds
}

// ownUpstreamDevicePlugin gives the DaemonSet the controller reference upstream KMM gives it.
func ownUpstreamDevicePlugin(t *testing.T, ds *appsv1.DaemonSet, m *kmmv1beta1.Module) {
	t.Helper()
	refs := []metav1.OwnerReference{{APIVersion: kmmv1beta1.GroupVersion.String(), Kind: "Module", Name: m.Name, UID: m.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": refs}})
	if err := k8s.Patch(context.Background(), ds, client.RawPatch(types.MergePatchType, data), client.FieldOwner(upstreamManager)); err != nil {
		t.Fatal(err)
	}
}

// dpCoverage watches the device plugin pods of Module name, upstream's and kmm's, on the test's
// nodes: from the first moment a node has a Ready one, every moment it has none is a gap; and an
// unload worker pod created while a device plugin pod of the Module is still on its node breaks
// invariant 6.
type dpCoverage struct {
	mu       sync.Mutex
	nodes    []string
	serving  map[string]map[types.UID]string // node → Ready, not deleted device plugin pods → "upstream" or "kmm"
	present  map[string]map[types.UID]bool   // node → device plugin pods that exist (Terminating included)
	armed    map[string]bool
	gapSince map[string]time.Time
	gaps     []string
	longest  time.Duration
	unloads  []string
	seenKMM  map[string]bool
	stopped  bool
	seenPods map[types.UID]bool
}

func watchDevicePluginCoverage(t *testing.T, tb *testbed.Bed, name string) *dpCoverage {
	c := &dpCoverage{nodes: slices.Clone(tb.Nodes), serving: map[string]map[types.UID]string{}, present: map[string]map[types.UID]bool{},
		armed: map[string]bool{}, gapSince: map[string]time.Time{}, seenKMM: map[string]bool{}, seenPods: map[types.UID]bool{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, func(ev watch.EventType, p *corev1.Pod) {
		c.observe(ev, p, name)
	}, client.InNamespace(tb.NS))
	return c
}

func devicePluginOwner(p *corev1.Pod, name string) string {
	switch {
	case p.Labels[contract.LabelDevicePlugin] == "true" && p.Labels[contract.LabelModuleName] == name:
		return "kmm"
	case p.Labels[upstreamModuleLabel] == name && p.Labels["kmm.node.kubernetes.io/worker-action"] == "":
		return "upstream"
	}
	return ""
}

func (c *dpCoverage) observe(ev watch.EventType, p *corev1.Pod, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := p.Spec.NodeName
	if n == "" || !slices.Contains(c.nodes, n) {
		return
	}
	if p.Labels[contract.LabelWorker] == "true" && p.Labels[contract.LabelAction] == string(contract.ActionUnload) && !c.seenPods[p.UID] {
		c.seenPods[p.UID] = true
		if len(c.present[n]) > 0 {
			c.unloads = append(c.unloads, fmt.Sprintf("unload pod %s on %s beside %d device plugin pods", p.Name, n, len(c.present[n])))
		}
	}
	owner := devicePluginOwner(p, name)
	if owner == "" {
		return
	}
	if c.serving[n] == nil {
		c.serving[n], c.present[n] = map[types.UID]string{}, map[types.UID]bool{}
	}
	delete(c.serving[n], p.UID)
	delete(c.present[n], p.UID)
	if ev != watch.Deleted {
		c.present[n][p.UID] = true
		if p.DeletionTimestamp == nil && podIsReady(p) {
			c.serving[n][p.UID] = owner
			c.seenKMM[n] = c.seenKMM[n] || owner == "kmm"
		}
	}
	if c.stopped {
		return
	}
	switch {
	case len(c.serving[n]) > 0 && !c.gapSince[n].IsZero():
		d := time.Since(c.gapSince[n])
		c.gaps = append(c.gaps, fmt.Sprintf("%s without a Ready device plugin pod for %v", n, d.Round(time.Millisecond)))
		c.longest = max(c.longest, d)
		c.gapSince[n] = time.Time{}
	case len(c.serving[n]) > 0:
		c.armed[n] = true
	case c.armed[n] && c.gapSince[n].IsZero():
		c.gapSince[n] = time.Now()
	}
}

// stop ends the coverage check (an ordered upgrade drains the device plugin on purpose) and returns
// the gaps seen, open ones included.
func (c *dpCoverage) stop() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	gaps := slices.Clone(c.gaps)
	for n, since := range c.gapSince {
		if !since.IsZero() {
			gaps = append(gaps, fmt.Sprintf("%s without a Ready device plugin pod since %v ago", n, time.Since(since).Round(time.Millisecond)))
		}
	}
	return gaps
}

// servedBy says, per node, who serves it now ("upstream", "kmm", or both).
func (c *dpCoverage) servedBy() map[string][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]string{}
	for _, n := range c.nodes {
		for _, o := range c.serving[n] {
			if !slices.Contains(out[n], o) {
				out[n] = append(out[n], o)
			}
		}
		slices.Sort(out[n])
	}
	return out
}

func (c *dpCoverage) invariant6() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.unloads)
}

func podIsReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestTakeoverHandsOverDevicePlugin: three nodes as upstream KMM leaves them for a versioned Module
// with a device plugin (its DaemonSet's pods Running and Ready, held by upstream's finalizer), then
// kmm: every pair Adopted without a worker pod, the ready label never removed, kmm's device plugin
// replaces upstream's without a moment a node has no Ready device plugin pod (watched); then a
// version bump upgrades each node the ordered way, and deleting the Module unloads everywhere and
// releases both finalizers.
func TestTakeoverHandsOverDevicePlugin(t *testing.T) {
	ctx := context.Background()
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	m := tb.VersionedModule("nic", "v1")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:v1"}}
	m.Finalizers = []string{module.UpstreamModuleFinalizer}
	w := watchTakeover(t, tb, "nic")
	cov := watchDevicePluginCoverage(t, tb, "nic")
	ns := tb.NS
	upstreamLabels := map[string]string{kmmv1beta1.ModuleVersionLabel(ns, "nic"): "v1", kmmv1beta1.WorkerPodVersionLabel(ns, "nic"): "v1",
		kmmv1beta1.DevicePluginVersionLabel(ns, "nic"): "v1", kmmv1beta1.DevicePluginReadyLabel(ns, "nic"): ""}
	for _, n := range tb.Nodes {
		d := fsm.DecideSpec(m, fsm.NodeView{Name: n, Labels: map[string]string{tb.Label: "yes", kmmv1beta1.WorkerPodVersionLabel(ns, "nic"): "v1"},
			KernelVersion: testbed.KernelA})
		if d.Entry == nil {
			t.Fatalf("no entry for nic on %s: %+v", n, d)
		}
		leaveAsUpstream(t, tb, upstreamNode{name: n, entry: *d.Entry, bootID: node.BootID(n),
			loaded: true, labels: upstreamLabels})
	}
	ds := leaveUpstreamDevicePlugin(t, tb, "nic", "v1")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		by := cov.servedBy()
		for _, n := range tb.Nodes {
			if !slices.Equal(by[n], []string{"upstream"}) {
				return false, fmt.Sprintf("upstream's device plugin Ready on every node: %v", by)
			}
		}
		return true, ""
	})

	start := time.Now()
	cluster.StartOperator(t)
	tb.Create(m)
	ownUpstreamDevicePlugin(t, ds, m)
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(ds), &appsv1.DaemonSet{})
		if !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("upstream's device plugin DaemonSet %s still there (%v); served by %v", ds.Name, err, cov.servedBy())
		}
		by := cov.servedBy()
		for _, n := range tb.Nodes {
			if !slices.Equal(by[n], []string{"kmm"}) {
				return false, fmt.Sprintf("only kmm's device plugin on every node: %v", by)
			}
		}
		return true, ""
	})
	t.Logf("device plugin handed over %v after the operator started", time.Since(start).Round(10*time.Millisecond))
	if gaps := cov.stop(); len(gaps) > 0 {
		t.Fatalf("device plugin coverage lost: %v", gaps)
	}
	for _, n := range tb.Nodes {
		st := cluster.PairStatus(n, ns, "nic")
		if st == nil || st.State != kmmv1beta1.StateLoaded || st.Reason != string(fsm.Adopted) || len(st.Transitions) != 1 {
			t.Fatalf("nic on %s: %s, want Loaded/Adopted after one transition", n, testbed.Describe(st))
		}
	}
	cluster.AssertEvents(t, ns, "UpstreamDevicePluginRemoved")
	created, removals := w.snapshot()
	if len(created) != 0 || len(removals) != 0 {
		t.Fatalf("the takeover created worker pods %v and removed the ready label on %v; want none", created, removals)
	}

	// A version bump after the takeover is an ordered upgrade as usual: drain, unload v1, load v2.
	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(ns, "nic"), "v2")
		tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
		// DevicePluginDraining only when the NMC controller sees the label move before the label
		// step has the device plugin pod gone (upgrade.TestRolloutAutomatic says why).
		cluster.AssertPassedThrough(t, n, ns, fsm.Unloading, fsm.Upgrading, fsm.Loading)
		testbed.Eventually(t, 20*time.Second, func() (bool, string) {
			got := cluster.Node(t, n).Labels[kmmv1beta1.VersionReadyLabel(ns, "nic")]
			return got == "v2", fmt.Sprintf("version.ready on %s is %q, want v2", n, got)
		})
	}
	// Deleting the Module unloads everywhere and releases kmm's and upstream's finalizers.
	if err := k8s.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), &kmmv1beta1.Module{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("the Module is still there (%v)", err)
		}
		for _, n := range tb.Nodes {
			if _, ok := node.Loaded(n)[ns+"/nic"]; ok {
				return false, "nic still loaded on " + n
			}
		}
		return true, ""
	})
	created, _ = w.snapshot()
	for _, n := range tb.Nodes {
		if created[n+" load"] != 1 || created[n+" unload"] != 2 {
			t.Errorf("worker pods on %s: %v, want one load (v2) and two unloads (v1, v2)", n, created)
		}
	}
	if v := cov.invariant6(); len(v) > 0 {
		t.Fatalf("invariant 6 broken: %v", v)
	}
}

// TestTakeoverUnloadsWhatNoModuleWants: a record upstream KMM left on a node the Module no longer
// selects is unloaded by one unload pod (it was dropped, with the module left in the kernel, before
// issue 18's fix), and only once upstream's device plugin pod left the node (invariant 6: the NMC
// controller reads upstream's pods before an unload); the selected node is adopted and keeps a
// device plugin pod throughout.
func TestTakeoverUnloadsWhatNoModuleWants(t *testing.T) {
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	selected, dropped := tb.Nodes[0], tb.Nodes[1]
	m := tb.Module("nic")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"}}
	w := watchTakeover(t, tb, "nic")
	cov := watchDevicePluginCoverage(t, tb, "nic")
	for _, n := range tb.Nodes {
		leaveAsUpstream(t, tb, upstreamNode{name: n, entry: decidedEntry(t, tb, m, n, testbed.KernelA), bootID: node.BootID(n), loaded: true})
	}
	ds := leaveUpstreamDevicePlugin(t, tb, "nic", "")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		by := cov.servedBy()
		return len(by[selected]) > 0 && len(by[dropped]) > 0, fmt.Sprintf("upstream's device plugin Ready on both nodes: %v", by)
	})
	cluster.SetNodeLabel(t, dropped, tb.Label, "")
	cluster.StartOperator(t)
	tb.Create(m)
	ownUpstreamDevicePlugin(t, ds, m)

	testbed.Eventually(t, 40*time.Second, func() (bool, string) {
		st := cluster.PairStatus(selected, tb.NS, "nic")
		if st == nil || st.Reason != string(fsm.Adopted) {
			return false, fmt.Sprintf("nic on %s: %s, want Adopted", selected, testbed.Describe(st))
		}
		if st := cluster.PairStatus(dropped, tb.NS, "nic"); st != nil {
			return false, fmt.Sprintf("nic on %s: %s, want no entry", dropped, testbed.Describe(st))
		}
		if _, ok := node.Loaded(dropped)[tb.NS+"/nic"]; ok {
			return false, "nic still in the kernel of " + dropped
		}
		return true, ""
	})
	created, _ := w.snapshot()
	if want := map[string]int{dropped + " unload": 1}; fmt.Sprint(created) != fmt.Sprint(want) {
		t.Errorf("worker pods %v, want %v", created, want)
	}
	if _, ok := cluster.Node(t, dropped).Labels[kmmv1beta1.ReadyLabel(tb.NS, "nic")]; ok {
		t.Errorf("%s keeps the ready label of a module it unloaded", dropped)
	}
	if v := cov.invariant6(); len(v) > 0 {
		t.Errorf("invariant 6 broken: %v", v)
	}
	cov.mu.Lock()
	gaps := slices.Clone(cov.gaps)
	open := cov.gapSince[selected]
	cov.mu.Unlock()
	for _, g := range gaps {
		if strings.HasPrefix(g, selected+" ") {
			t.Errorf("device plugin coverage lost on the adopted node: %s", g)
		}
	}
	if !open.IsZero() {
		t.Errorf("%s has had no Ready device plugin pod since %v", selected, open)
	}
}

// TestTakeoverHandoverStuckIsReported: kmm's device plugin cannot run on one node (it lacks the
// toleration of a taint upstream's device plugin tolerates), so the handover waits there. Past the
// handover timeout upstream's DaemonSet stays (the node keeps a Ready device plugin pod) and the
// Module is Degraded with reason DevicePluginHandoverStuck naming that node, with one Event; once
// the taint goes, kmm's pod runs there, upstream's DaemonSet goes and the Module is no longer
// Degraded. Before the fix the handover waited silently, with no bound.
func TestTakeoverHandoverStuckIsReported(t *testing.T) {
	ctx := context.Background()
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	served, stuck := tb.Nodes[0], tb.Nodes[1]
	m := tb.Module("nic")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"}}
	cov := watchDevicePluginCoverage(t, tb, "nic")
	for _, n := range tb.Nodes {
		leaveAsUpstream(t, tb, upstreamNode{name: n, entry: decidedEntry(t, tb, m, n, testbed.KernelA), bootID: node.BootID(n), loaded: true})
	}
	const taintKey = "example.com/upstream-device-plugin-only"
	setTaint := func(on bool) {
		taints := []corev1.Taint{}
		if on {
			taints = append(taints, corev1.Taint{Key: taintKey, Effect: corev1.TaintEffectNoSchedule})
		}
		data, _ := json.Marshal(map[string]any{"spec": map[string]any{"taints": taints}})
		if err := k8s.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: stuck}}, client.RawPatch(types.MergePatchType, data)); err != nil {
			t.Fatal(err)
		}
	}
	setTaint(true)
	ds := leaveUpstreamDevicePlugin(t, tb, "nic", "")
	tol, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"tolerations": []corev1.Toleration{{Key: taintKey, Operator: corev1.TolerationOpExists}}}}}})
	if err := k8s.Patch(ctx, ds, client.RawPatch(types.MergePatchType, tol)); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		by := cov.servedBy()
		return len(by[served]) > 0 && len(by[stuck]) > 0, fmt.Sprintf("upstream's device plugin Ready on both nodes: %v", by)
	})

	const timeout = 3 * time.Second
	start := time.Now()
	cluster.StartOperatorWith(t, func(o *app.Options) { o.HandoverTimeout = timeout })
	tb.Create(m)
	ownUpstreamDevicePlugin(t, ds, m)
	degraded := func() *metav1.Condition {
		got := &kmmv1beta1.Module{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionDegraded)
	}
	testbed.Eventually(t, 40*time.Second, func() (bool, string) {
		c := degraded()
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != kmmv1beta1.ReasonDevicePluginHandoverStuck {
			return false, fmt.Sprintf("Degraded: %+v, want True/%s; served by %v", c, kmmv1beta1.ReasonDevicePluginHandoverStuck, cov.servedBy())
		}
		if !strings.Contains(c.Message, stuck) || strings.Contains(c.Message, served) {
			return false, fmt.Sprintf("Degraded message %q should name %s and not %s", c.Message, stuck, served)
		}
		return true, ""
	})
	// The handover starts at the creation of the newest device plugin DaemonSet (upstream's or
	// kmm's), a timestamp of one-second resolution: the timeout is counted from there.
	sets := &appsv1.DaemonSetList{}
	if err := k8s.List(ctx, sets, client.InNamespace(tb.NS)); err != nil {
		t.Fatal(err)
	}
	var since time.Time
	for i := range sets.Items {
		if c := sets.Items[i].CreationTimestamp.Time; c.After(since) {
			since = c
		}
	}
	if elapsed := time.Since(since); elapsed < timeout {
		t.Errorf("reported stuck %v after the newest device plugin DaemonSet's creation (%v after the operator started), before the timeout %v",
			elapsed, time.Since(start), timeout)
	}
	time.Sleep(3 * time.Second) // more handover polls: still one Event, upstream's DaemonSet kept
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil || ds.DeletionTimestamp != nil {
		t.Fatalf("upstream's DaemonSet was deleted while kmm's device plugin does not serve %s (%v)", stuck, err)
	}
	if by := cov.servedBy(); !slices.Contains(by[stuck], "upstream") || !slices.Contains(by[served], "kmm") {
		t.Errorf("served by %v: want upstream's device plugin kept on %s and kmm's on %s", by, stuck, served)
	}
	if n := countEvents(t, tb.NS, kmmv1beta1.ReasonDevicePluginHandoverStuck); n != 1 {
		t.Errorf("%d Events %s, want 1", n, kmmv1beta1.ReasonDevicePluginHandoverStuck)
	}

	setTaint(false)
	testbed.Eventually(t, 40*time.Second, func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(ds), &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("upstream's DaemonSet still there (%v); served by %v", err, cov.servedBy())
		}
		if c := degraded(); c == nil || c.Status != metav1.ConditionFalse {
			return false, fmt.Sprintf("Degraded: %+v, want False", c)
		}
		return true, ""
	})
	if gaps := cov.stop(); len(gaps) > 0 {
		t.Fatalf("device plugin coverage lost: %v", gaps)
	}
}

// countEvents counts the Events of a reason in a namespace.
func countEvents(t *testing.T, ns, reason string) int {
	t.Helper()
	n := 0
	for _, e := range listEvents(t, ns) {
		if e.Reason == reason {
			n++
		}
	}
	return n
}
