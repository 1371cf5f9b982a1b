package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
)

// usesLabel marks the workload pods of the drain: its value is the Module they use.
const usesLabel = "kmm-chaos/uses"

// podInfo is what the watcher keeps of a pod.
type podInfo struct {
	name, uid    string // the pod's namespace/name and UID, for the violation messages
	node, module string // module as namespace/name
	kind         string // load, unload, device-plugin, workload
	kernel       string // a load pod's config kernel
	terminal     bool
}

// watcher checks SPEC §4's invariants on every event it receives from its own watches (its own
// client, straight to kube-apiserver, not through a replica's proxy), and the writes the proxies
// report against the Lease holder.
type watcher struct {
	leases *leaseBook

	mu sync.Mutex
	// pods are by namespace/name, as the informer feeding them keys its store: when a pod is
	// deleted and another is created under its name while the watch is down, the relist delivers
	// the new pod as an update of the old one (no delete), so a map by UID would keep both.
	pods    map[string]podInfo
	kernels map[string]string // node → kernel
	// drainCheck is on while an ordered upgrade with drain runs (a Module's deletion unloads
	// without a drain, by design).
	drainCheck bool
	checks     map[string]int
	viols      []string
	events     int
}

// Invariant names, as the report counts their checks.
const (
	invOnePod       = "one worker pod per pair (SPEC §4.3)"
	invLoadKernel   = "load only for the node's kernel (§4.4)"
	invUnloadVsDP   = "no unload while the device plugin pod runs (§4.6)"
	invUnloadVsWork = "no unload before the drain emptied the node (§7)"
	invLogReplays   = "transition log ends in the stored state (§4.8)"
	invLeader       = "no write by a replica without the Lease"
	invCordons      = "every kmm cordon lifted at the end"
	invConverged    = "every pair converged, none stuck (§4.7)"
)

func newWatcher(leases *leaseBook) *watcher {
	return &watcher{leases: leases, pods: map[string]podInfo{}, kernels: map[string]string{}, checks: map[string]int{}}
}

// start runs the watches until ctx ends.
func (w *watcher) start(ctx context.Context, cfg *rest.Config) error {
	c, err := cache.New(cfg, cache.Options{Scheme: app.NewScheme()})
	if err != nil {
		return err
	}
	handlers := map[client.Object]toolscache.ResourceEventHandler{
		&corev1.Pod{}:                   w.handler(func(o any, gone bool) { w.podEvent(o.(*corev1.Pod), gone) }),
		&corev1.Node{}:                  w.handler(func(o any, gone bool) { w.nodeEvent(o.(*corev1.Node), gone) }),
		&kmmv1beta1.NodeModulesConfig{}: w.handler(func(o any, _ bool) { w.nmcEvent(o.(*kmmv1beta1.NodeModulesConfig)) }),
	}
	for obj, h := range handlers {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return errors.New("the watcher's cache did not sync")
	}
	return nil
}

// handler turns informer callbacks into f(object, deleted).
func (w *watcher) handler(f func(o any, gone bool)) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { f(o, false) },
		UpdateFunc: func(_, o any) { f(o, false) },
		DeleteFunc: func(o any) {
			if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			f(o, true)
		},
	}
}

// violate records a violation of inv, stamped with the time the watcher saw it.
func (w *watcher) violate(inv, format string, args ...any) {
	w.viols = append(w.viols, inv+": "+fmt.Sprintf(format, args...)+" (at "+time.Now().Format("15:04:05.000")+")")
}

// classify says what a pod is to the invariants ("" for none of kmm's concern).
func classify(p *corev1.Pod) podInfo {
	l := p.Labels
	in := podInfo{name: p.Namespace + "/" + p.Name, uid: string(p.UID), node: p.Spec.NodeName, terminal: p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed}
	switch {
	case l[contract.LabelWorker] == "true":
		in.kind, in.module = l[contract.LabelAction], l[contract.LabelModuleNamespace]+"/"+l[contract.LabelModuleName]
		var cfg contract.Config
		if json.Unmarshal([]byte(p.Annotations[contract.AnnotationConfig]), &cfg) == nil {
			in.kernel = cfg.Config.KernelVersion
		}
	case l[contract.LabelDevicePlugin] == "true":
		in.kind, in.module = "device-plugin", l[contract.LabelModuleNamespace]+"/"+l[contract.LabelModuleName]
	case l[usesLabel] != "":
		in.kind, in.module = "workload", p.Namespace+"/"+l[usesLabel]
	}
	return in
}

func (w *watcher) podEvent(p *corev1.Pod, gone bool) {
	in := classify(p)
	if in.kind == "" || in.node == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events++
	if gone {
		delete(w.pods, in.name)
		return
	}
	w.pods[in.name] = in
	w.checkNode(in.node)
}

// checkNode checks the pod invariants of one node (w.mu held).
func (w *watcher) checkNode(node string) {
	workers := map[string][]podInfo{}
	dps, workloads := map[string]bool{}, map[string]bool{}
	for _, x := range w.pods {
		if x.node != node {
			continue
		}
		switch x.kind {
		case "load", "unload":
			workers[x.module] = append(workers[x.module], x)
		case "device-plugin":
			dps[x.module] = true
		case "workload":
			workloads[x.module] = workloads[x.module] || !x.terminal
		}
	}
	w.checks[invOnePod]++
	w.checks[invLoadKernel]++
	w.checks[invUnloadVsDP]++
	if w.drainCheck {
		w.checks[invUnloadVsWork]++
	}
	for m, pods := range workers {
		if len(pods) > 1 {
			w.violate(invOnePod, "%d worker pods for %s on %s: %s", len(pods), m, node, describePods(pods))
		}
		for _, x := range pods {
			w.checkWorker(x, node, dps[m], workloads[m])
		}
	}
}

// checkWorker checks one worker pod against the node's kernel, device plugin and workload pods.
func (w *watcher) checkWorker(x podInfo, node string, dpThere, workloadThere bool) {
	if x.terminal {
		return
	}
	if x.kind == "load" && w.kernels[node] != "" && x.kernel != w.kernels[node] {
		w.violate(invLoadKernel, "a load pod of %s for kernel %q on %s, which runs %q: %s", x.module, x.kernel, node, w.kernels[node], describePods([]podInfo{x}))
	}
	if x.kind == "unload" && dpThere {
		w.violate(invUnloadVsDP, "an unload pod of %s on %s while its device plugin pod is there: %s", x.module, node, describePods([]podInfo{x}))
	}
	if x.kind == "unload" && w.drainCheck && workloadThere {
		w.violate(invUnloadVsWork, "an unload pod of %s on %s while a workload pod using it runs there: %s", x.module, node, describePods([]podInfo{x}))
	}
}

// describePods names pods for a violation message: namespace/name, UID, kind and phase.
func describePods(pods []podInfo) string {
	parts := make([]string, 0, len(pods))
	for _, x := range pods {
		state := "running"
		if x.terminal {
			state = "finished"
		}
		parts = append(parts, fmt.Sprintf("%s (uid %s, %s, %s)", x.name, x.uid, x.kind, state))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func (w *watcher) nodeEvent(n *corev1.Node, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events++
	if gone {
		delete(w.kernels, n.Name)
		return
	}
	w.kernels[n.Name] = n.Status.NodeInfo.KernelVersion
	w.checkNode(n.Name)
}

func (w *watcher) nmcEvent(nmc *kmmv1beta1.NodeModulesConfig) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.events++
	for _, st := range nmc.Status.Modules {
		w.checks[invLogReplays]++
		if n := len(st.Transitions); n > 0 && st.Transitions[n-1].To != st.State {
			w.violate(invLogReplays, "%s/%s on %s is %s but its log ends in %s", st.Namespace, st.Name, nmc.Name, st.State, st.Transitions[n-1].To)
		}
	}
}

// write is a proxy's report of a write a replica sends: the replica must hold the Lease.
func (w *watcher) write(s sentWrite) {
	holder, since := w.leases.currentSince()
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checks[invLeader]++
	if holder != s.replica {
		w.violate(invLeader, "replica %s sent %s %s while %q held the Lease (for %v; the write reached the proxy %v ago)",
			s.replica, s.method, s.path, holder, now.Sub(since).Round(time.Millisecond), now.Sub(s.arrived).Round(time.Millisecond))
	}
}

func (w *watcher) setDrainCheck(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drainCheck = on
}

// final records an end-of-run check and its violations.
func (w *watcher) final(inv string, viols []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checks[inv]++
	for _, v := range viols {
		w.violate(inv, "%s", v)
	}
}

func (w *watcher) result() (map[string]int, []string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	checks := make(map[string]int, len(w.checks))
	for k, v := range w.checks {
		checks[k] = v
	}
	return checks, append([]string(nil), w.viols...), w.events
}
