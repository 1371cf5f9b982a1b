package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// upstreamManager is the field manager upstream KMM's controllers write with (the binary's name).
const upstreamManager = "manager"

// upstreamNode is what upstream KMM left on one node for one Module.
type upstreamNode struct {
	name string
	// entry is upstream's spec entry and record (the config its worker applied).
	entry kmmv1beta1.NodeModuleSpec
	// bootID is the boot ID upstream recorded.
	bootID string
	// loaded says whether the module is in the node's (simulated) kernel.
	loaded bool
	// labels are more node labels upstream left (version labels, device-plugin-ready).
	labels map[string]string
}

// leaveAsUpstream puts the state upstream KMM leaves on a node: the NMC with spec entry and status
// record in upstream's spelling, spec.modules owned atomically by upstream's manager (its schema
// had a plain list), upstream's NMC labels, the node's ready label, a finished worker pod holding
// upstream's finalizer, and the module in the node's kernel.
func leaveAsUpstream(t *testing.T, tb *testbed.Bed, u upstreamNode) {
	t.Helper()
	ctx := context.Background()
	ns, name := u.entry.Namespace, u.entry.Name
	cfg := *u.entry.Config.DeepCopy()
	cfg.ImagePullPolicy, cfg.InsecurePull = corev1.PullIfNotPresent, cfg.RegistryTLS.Insecure
	cfg.RegistryTLS = kmmv1beta1.TLSOptions{}
	spec := kmmv1beta1.NodeModuleSpec{Namespace: ns, Name: name, Config: cfg, Version: cfg.Version,
		Tolerations: []corev1.Toleration{{Key: "upstream-only", Operator: corev1.TolerationOpExists}}}
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: u.name, Labels: map[string]string{
		"beta.kmm.node.kubernetes.io/" + ns + "." + name + ".module-configured": "",
		"beta.kmm.node.kubernetes.io/" + ns + "." + name + ".module-in-use":     "",
	}}, Spec: kmmv1beta1.NodeModulesConfigSpec{Modules: []kmmv1beta1.NodeModuleSpec{spec}}}
	if err := k8s.Create(ctx, nmc, client.FieldOwner(upstreamManager)); err != nil {
		t.Fatal(err)
	}
	rec := cfg
	nmc.Status.Modules = []kmmv1beta1.NodeModuleStatus{{Namespace: ns, Name: name, Config: &rec, UpstreamBootID: u.bootID,
		Version: cfg.Version, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))}}
	if err := k8s.Status().Update(ctx, nmc, client.FieldOwner(upstreamManager)); err != nil {
		t.Fatal(err)
	}
	// Upstream's ownership: spec.modules as one atomic field, as its plain-list schema recorded it.
	atomic := []map[string]any{{
		"manager": upstreamManager, "operation": "Update", "apiVersion": kmmv1beta1.GroupVersion.String(), "fieldsType": "FieldsV1",
		"time": time.Now().UTC().Format(time.RFC3339),
		"fieldsV1": map[string]any{"f:metadata": map[string]any{"f:labels": map[string]any{".": map[string]any{}}},
			"f:spec": map[string]any{".": map[string]any{}, "f:modules": map[string]any{}}},
	}}
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"managedFields": atomic}})
	if err := k8s.Patch(ctx, nmc, client.RawPatch(types.MergePatchType, data)); err != nil {
		t.Fatal(err)
	}
	// The ready label's value is empty (testbed.SetNodeLabel would delete it).
	nodeLabels := map[string]string{kmmv1beta1.ReadyLabel(ns, name): ""}
	maps.Copy(nodeLabels, u.labels)
	ready, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": nodeLabels}})
	if err := k8s.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: u.name}}, client.RawPatch(types.MergePatchType, ready)); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kmm-worker-" + u.name + "-" + name,
		Labels:     map[string]string{"kmm.node.kubernetes.io/worker-action": "Load", "kmm.node.kubernetes.io/module.name": name},
		Finalizers: []string{"kmm.node.kubernetes.io/nodemodulesconfig-reconciler"}},
		Spec: corev1.PodSpec{NodeName: u.name, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "worker", Image: "reg.example.com/upstream-worker:1"}}}}
	if err := k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodSucceeded
		return k8s.Status().Update(ctx, pod)
	}); err != nil {
		t.Fatal(err)
	}
	if u.loaded {
		node.Preload(u.name, ns+"/"+name, u.entry.Config)
	}
}

// decidedEntry is kmm's spec entry of m on a node of tb running kernel.
func decidedEntry(t *testing.T, tb *testbed.Bed, m *kmmv1beta1.Module, nodeName, kernel string) kmmv1beta1.NodeModuleSpec {
	t.Helper()
	d := fsm.DecideSpec(m, fsm.NodeView{Name: nodeName, Labels: map[string]string{tb.Label: "yes"}, KernelVersion: kernel})
	if d.Entry == nil {
		t.Fatalf("no entry for %s on %s: %+v", m.Name, kernel, d)
	}
	return *d.Entry
}

// takeoverWatch counts, from before kmm starts, the worker pods created on the test's nodes and
// the removals of the module's ready label.
type takeoverWatch struct {
	mu       sync.Mutex
	created  map[string]int
	removals []string
	hasLabel map[string]bool
}

func watchTakeover(t *testing.T, tb *testbed.Bed, module string) *takeoverWatch {
	w := &takeoverWatch{created: map[string]int{}, hasLabel: map[string]bool{}}
	seen := map[types.UID]bool{}
	testbed.Watch(t, cluster, &corev1.PodList{}, func(_ watch.EventType, p *corev1.Pod) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !seen[p.UID] && p.Labels[contract.LabelWorker] == "true" {
			seen[p.UID] = true
			w.created[p.Spec.NodeName+" "+p.Labels[contract.LabelAction]]++
		}
	}, client.InNamespace(tb.NS))
	ready := kmmv1beta1.ReadyLabel(tb.NS, module)
	testbed.Watch(t, cluster, &corev1.NodeList{}, func(_ watch.EventType, n *corev1.Node) {
		if !slices.Contains(tb.Nodes, n.Name) {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		_, has := n.Labels[ready]
		if w.hasLabel[n.Name] && !has {
			w.removals = append(w.removals, n.Name)
		}
		w.hasLabel[n.Name] = has
	})
	return w
}

func (w *takeoverWatch) snapshot() (map[string]int, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := map[string]int{}
	for k, v := range w.created {
		c[k] = v
	}
	return c, slices.Clone(w.removals)
}

// TestTakeoverFromUpstream: three nodes as upstream KMM leaves them, then kmm: every pair Loaded
// with reason Adopted, no worker pod, the ready label never removed, upstream's NMC labels and
// field ownership gone; then an image change upgrades as usual and deleting the Module unloads
// everywhere and releases kmm's and upstream's finalizers.
func TestTakeoverFromUpstream(t *testing.T) {
	ctx := context.Background()
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	m := tb.Module("nic")
	m.Finalizers = []string{module.UpstreamModuleFinalizer}
	w := watchTakeover(t, tb, "nic")
	for _, n := range tb.Nodes {
		leaveAsUpstream(t, tb, upstreamNode{name: n, entry: decidedEntry(t, tb, m, n, testbed.KernelA), bootID: node.BootID(n), loaded: true})
	}
	testbed.Eventually(t, 5*time.Second, func() (bool, string) { // the watch saw the labels before kmm comes
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, n := range tb.Nodes {
			if !w.hasLabel[n] {
				return false, "the ready label on " + n
			}
		}
		return true, ""
	})
	start := time.Now()
	cluster.StartOperator(t)
	// The NMC controller meets upstream's records before the Module controller rewrote a single
	// entry (the webhook refuses Modules until the operator runs): they wait, labels untouched.
	time.Sleep(time.Second)
	tb.Create(m)

	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			st := cluster.PairStatus(n, tb.NS, "nic")
			if st == nil || st.State != kmmv1beta1.StateLoaded || st.Reason != string(fsm.Adopted) || len(st.Transitions) != 1 {
				return false, fmt.Sprintf("nic on %s: %s, want Loaded/Adopted after one transition%s", n, testbed.Describe(st), dumpNMC(n))
			}
		}
		return true, ""
	})
	t.Logf("every pair Adopted %v after the operator started", time.Since(start).Round(10*time.Millisecond))
	cluster.AssertEvents(t, metav1.NamespaceDefault, string(fsm.Adopted))
	// The Module→NMC controller has converged: kmm's entry, kmm's ownership, upstream's labels gone.
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			nmc := &kmmv1beta1.NodeModulesConfig{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: n}, nmc); err != nil {
				return false, err.Error()
			}
			e := nmc.SpecEntry(tb.NS, "nic")
			if e == nil || len(e.Tolerations) != 0 || e.Version != "" || e.Config.ImagePullPolicy != "" {
				return false, fmt.Sprintf("entry on %s still has upstream's leftovers: %+v", n, e)
			}
			for k := range nmc.Labels {
				return false, fmt.Sprintf("NMC %s keeps label %s", n, k)
			}
			if nmc.Annotations[module.TakenOverAnnotation] == "" {
				return false, fmt.Sprintf("NMC %s lacks the taken-over annotation", n)
			}
			for _, mf := range nmc.ManagedFields {
				if mf.Subresource == "" && mf.Manager != "kmm-module/"+tb.NS+"/nic" && mf.Manager != "kmm-takeover" {
					return false, fmt.Sprintf("NMC %s: fields still owned by %s (%s)", n, mf.Manager, mf.Operation)
				}
			}
			pods := &corev1.PodList{}
			if err := k8s.List(ctx, pods, client.InNamespace(tb.NS), client.HasLabels{"kmm.node.kubernetes.io/worker-action"}); err != nil || len(pods.Items) > 0 {
				return false, fmt.Sprintf("upstream worker pods left: %d (%v)", len(pods.Items), err)
			}
		}
		return true, ""
	})
	time.Sleep(2 * time.Second) // anything kmm would still do on its own, it has done by now
	created, removals := w.snapshot()
	if len(created) != 0 || len(removals) != 0 {
		t.Fatalf("the takeover created worker pods %v and removed the ready label on %v; want none", created, removals)
	}
	for _, n := range tb.Nodes {
		if c := node.RunCount(n, tb.NS+"/nic"); c != 0 {
			t.Errorf("node %s ran %d worker pods", n, c)
		}
	}

	// After the takeover kmm runs the module as its own: an image change upgrades it...
	setImage(t, m.Namespace, m.Name, "reg.example.com/nic:a2")
	tb.WaitLoaded("nic", "reg.example.com/nic:a2", tb.Nodes...)
	// ... and deleting the Module unloads it everywhere and releases both finalizers.
	if err := k8s.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(m), &kmmv1beta1.Module{})
		if !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("the Module is still there (%v)", err)
		}
		for _, n := range tb.Nodes {
			if _, ok := node.Loaded(n)[tb.NS+"/nic"]; ok {
				return false, "nic still loaded on " + n
			}
		}
		return true, ""
	})
	created, _ = w.snapshot()
	for _, n := range tb.Nodes {
		if created[n+" reload"] != 1 || created[n+" unload"] != 1 || created[n+" load"] != 0 {
			t.Errorf("worker pods on %s: %v, want one reload (a to a2, issue 22) and one unload (a2)", n, created)
		}
	}
}

// TestTakeoverMustNotAdopt: records upstream left that do not prove the module loaded as kmm wants
// it go through the normal rules: a reboot since (another boot ID) loads again, a kernel upgrade
// since loads for the new kernel, another config unloads upstream's first (in one reload worker).
func TestTakeoverMustNotAdopt(t *testing.T) {
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	tb.AddNode(fmt.Sprintf("%s-kb", tb.Nodes[0]), testbed.KernelB)
	rebooted, changedConfig, newKernel := tb.Nodes[0], tb.Nodes[1], tb.Nodes[2]
	m := tb.Module("nic")
	w := watchTakeover(t, tb, "nic")
	oldImage := decidedEntry(t, tb, m, changedConfig, testbed.KernelA)
	oldImage.Config.ContainerImage = "reg.example.com/nic:old"
	leaveAsUpstream(t, tb, upstreamNode{name: rebooted, entry: decidedEntry(t, tb, m, rebooted, testbed.KernelA), bootID: "boot-before-the-switch"})
	leaveAsUpstream(t, tb, upstreamNode{name: changedConfig, entry: oldImage, bootID: node.BootID(changedConfig), loaded: true})
	leaveAsUpstream(t, tb, upstreamNode{name: newKernel, entry: decidedEntry(t, tb, m, newKernel, testbed.KernelA), bootID: node.BootID(newKernel)})
	cluster.StartOperator(t)
	tb.Create(m)

	tb.WaitLoaded("nic", "reg.example.com/nic:a", rebooted, changedConfig)
	tb.WaitLoaded("nic", "reg.example.com/nic:b-6.1.0", newKernel)
	created, _ := w.snapshot()
	// The config upstream loaded is replaced by one reload worker (issue 22): nothing to drain.
	want := map[string]int{rebooted + " load": 1, changedConfig + " reload": 1, newKernel + " load": 1}
	if fmt.Sprint(created) != fmt.Sprint(want) {
		t.Errorf("worker pods %v, want %v", created, want)
	}
	for _, n := range tb.Nodes {
		st := cluster.PairStatus(n, tb.NS, "nic")
		if slices.ContainsFunc(st.Transitions, func(tr kmmv1beta1.Transition) bool { return tr.Trigger == string(fsm.Adopted) }) {
			t.Errorf("%s adopted: %s", n, testbed.Describe(st))
		}
	}
}

func dumpNMC(n string) string {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	_ = k8s.Get(context.Background(), client.ObjectKey{Name: n}, nmc)
	mods := &kmmv1beta1.ModuleList{}
	_ = k8s.List(context.Background(), mods)
	var conds []string
	for _, m := range mods.Items {
		for _, c := range m.Status.Conditions {
			conds = append(conds, m.Name+":"+c.Type+"="+string(c.Status)+" "+c.Message)
		}
	}
	pods := &corev1.PodList{}
	_ = k8s.List(context.Background(), pods)
	for _, p := range pods.Items {
		if p.Spec.NodeName == n {
			conds = append(conds, "pod "+p.Name+" "+string(p.Status.Phase)+fmt.Sprint(p.Finalizers, p.DeletionTimestamp))
		}
	}
	data, _ := json.Marshal(nmc)
	return "\n" + string(data) + "\n" + fmt.Sprint(conds)
}

// TestTakeoverFieldRemovedStaysRemoved: the takeover patch writes kmm's entry where upstream's was;
// fields kmm's entry has and upstream's had not (the worker pods' service account, pull secret and
// tolerations here) are then co-owned by the takeover's field manager and the Module's. Once the
// user removes them from the Module, they go from the NMC entry and stay gone: the takeover manager
// no longer owns them (before the fix it did, and the NMC kept them forever).
func TestTakeoverFieldRemovedStaysRemoved(t *testing.T) {
	ctx := context.Background()
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	m := tb.Module("nic")
	m.Spec.ModuleLoader.ServiceAccountName = "nic-worker"
	m.Spec.ImageRepoSecret = &corev1.LocalObjectReference{Name: "nic-pull"}
	m.Spec.Tolerations = []corev1.Toleration{{Key: "example.com/kmod", Operator: corev1.TolerationOpExists}}
	for _, n := range tb.Nodes {
		e := decidedEntry(t, tb, m, n, testbed.KernelA)
		e.ServiceAccountName, e.ImageRepoSecret = "", nil // upstream's entry lacks what kmm's has
		leaveAsUpstream(t, tb, upstreamNode{name: n, entry: e, bootID: node.BootID(n), loaded: true})
	}
	cluster.StartOperator(t)
	tb.Create(m)
	entries := func(want func(*kmmv1beta1.NodeModuleSpec) string) func() (bool, string) {
		return func() (bool, string) {
			for _, n := range tb.Nodes {
				nmc := &kmmv1beta1.NodeModulesConfig{}
				if err := k8s.Get(ctx, client.ObjectKey{Name: n}, nmc); err != nil {
					return false, err.Error()
				}
				e := nmc.SpecEntry(tb.NS, "nic")
				if e == nil {
					return false, "no entry on " + n
				}
				if why := want(e); why != "" {
					return false, n + ": " + why + fmt.Sprintf(" (entry %+v, managedFields %s)", e, managersOf(nmc))
				}
			}
			return true, ""
		}
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if st := cluster.PairStatus(n, tb.NS, "nic"); st == nil || st.Reason != string(fsm.Adopted) {
				return false, fmt.Sprintf("nic on %s: %s, want Adopted", n, testbed.Describe(st))
			}
		}
		return true, ""
	})
	testbed.Eventually(t, 20*time.Second, entries(func(e *kmmv1beta1.NodeModuleSpec) string {
		if e.ServiceAccountName != "nic-worker" || e.ImageRepoSecret == nil || len(e.Tolerations) != 1 || e.Tolerations[0].Key != "example.com/kmod" {
			return "kmm's entry not written yet"
		}
		return ""
	}))

	editModule(t, client.ObjectKeyFromObject(m), func(got *kmmv1beta1.Module) {
		got.Spec.ModuleLoader.ServiceAccountName, got.Spec.ImageRepoSecret, got.Spec.Tolerations = "", nil, nil
	})
	removed := entries(func(e *kmmv1beta1.NodeModuleSpec) string {
		if e.ServiceAccountName != "" || e.ImageRepoSecret != nil || len(e.Tolerations) != 0 {
			return "fields removed from the Module are still in the entry"
		}
		return ""
	})
	testbed.Eventually(t, 20*time.Second, removed)
	time.Sleep(3 * time.Second) // anything kmm would write again, it has written by now
	if ok, why := removed(); !ok {
		t.Fatalf("a removed field came back: %s", why)
	}
}

// managersOf lists an NMC's managedFields entries as manager (operation, subresource).
func managersOf(nmc *kmmv1beta1.NodeModulesConfig) string {
	var out []string
	for _, mf := range nmc.ManagedFields {
		out = append(out, fmt.Sprintf("%s(%s%s): %s", mf.Manager, mf.Operation, mf.Subresource, mf.FieldsV1.GetRawString()))
	}
	return fmt.Sprint(out)
}

// TestTakeoverRemovesOrphanedEntry: upstream KMM left a spec entry and a record of a Module that no
// longer exists (deleted while upstream was stopped, its finalizer removed by hand). No Module
// reconcile would ever rewrite that entry, so the record waited for kmm's entry forever and the
// module stayed in the kernel (before the fix). Past the grace, the Module→NMC controller removes
// the entry, with an Event on the NMC, and the NMC controller unloads the module with one unload
// pod.
func TestTakeoverRemovesOrphanedEntry(t *testing.T) {
	ctx := context.Background()
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	gone := tb.Module("gone")
	w := watchTakeover(t, tb, "gone")
	leaveAsUpstream(t, tb, upstreamNode{name: n, entry: decidedEntry(t, tb, gone, n, testbed.KernelA), bootID: node.BootID(n), loaded: true})
	start := time.Now()
	cluster.StartOperatorWith(t, func(o *app.Options) { o.OrphanGrace = 2 * time.Second })

	testbed.Eventually(t, 40*time.Second, func() (bool, string) {
		nmc := &kmmv1beta1.NodeModulesConfig{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: n}, nmc); err != nil && !apierrors.IsNotFound(err) {
			return false, err.Error()
		}
		if e := nmc.SpecEntry(tb.NS, "gone"); e != nil {
			return false, "the orphaned spec entry is still there" + dumpNMC(n)
		}
		if _, ok := node.Loaded(n)[tb.NS+"/gone"]; ok {
			return false, "gone is still in the kernel of " + n + dumpNMC(n)
		}
		if st := nmc.StatusEntry(tb.NS, "gone"); st != nil {
			return false, "status entry left: " + testbed.Describe(st)
		}
		return true, ""
	})
	t.Logf("orphaned entry removed and unloaded %v after the operator started", time.Since(start).Round(10*time.Millisecond))
	if elapsed := time.Since(start); elapsed < 2*time.Second {
		t.Errorf("removed after %v, before the grace", elapsed)
	}
	cluster.AssertEvents(t, metav1.NamespaceDefault, module.ReasonOrphanedEntryRemoved)
	created, _ := w.snapshot()
	if want := map[string]int{n + " unload": 1}; fmt.Sprint(created) != fmt.Sprint(want) {
		t.Errorf("worker pods %v, want %v", created, want)
	}
}
