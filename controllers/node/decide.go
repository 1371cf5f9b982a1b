package node

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// decision is what one reconcile decided for the node: every pair's outcome, the changes of the
// node's labels (a merge patch: nil removes a label; empty when nothing changes) and when to look
// at the node again (0: on the next event).
type decision struct {
	outcomes     []pairOutcome
	labels       map[string]any
	requeueAfter time.Duration
}

// decide runs fsm.Step for every pair and fsm.NodeLabels for the node. When a pair is about to
// unload, upstream KMM's device plugin pods on the node are read (a fact read only then) and the
// pairs decided again with them.
func (r *NMCReconciler) decide(ctx context.Context, f *nodeFacts, now time.Time) (decision, error) {
	outcomes, err := r.decidePairs(ctx, f, now)
	if err != nil {
		return decision{}, err
	}
	if again, err := r.upstreamDevicePluginsBeforeUnload(ctx, f, outcomes); err != nil {
		return decision{}, err
	} else if again {
		if outcomes, err = r.decidePairs(ctx, f, now); err != nil {
			return decision{}, err
		}
	}
	d := decision{outcomes: outcomes, labels: labelChanges(f, outcomes), requeueAfter: requeueAfter(outcomes)}
	if f.upstreamDevicePlugins && (d.requeueAfter == 0 || d.requeueAfter > fsm.UpstreamWait) {
		d.requeueAfter = fsm.UpstreamWait // upstream's device plugin pods are not watched
	}
	return d, nil
}

// decidePairs runs fsm.Step for every pair known on the node.
func (r *NMCReconciler) decidePairs(ctx context.Context, f *nodeFacts, now time.Time) ([]pairOutcome, error) {
	node := observeNode(f.node)
	var out []pairOutcome
	for _, key := range pairKeys(f) {
		facts := r.pairFacts(f, key, node, now)
		drain, err := r.drainFacts(ctx, f, key, &facts)
		if err != nil {
			return nil, fmt.Errorf("reading the workloads to drain for %s: %w", key, err)
		}
		facts.Drain = drain
		res := fsm.Step(facts)
		out = append(out, pairOutcome{key: key, result: res, pod: f.workers[key], worker: facts.Worker, from: facts.Status.State})
	}
	return out, nil
}

// logOutcomes logs the transitions of the decision the reconcile acts on, and counts unpermitted
// triggers.
func logOutcomes(outcomes []pairOutcome, log logr.Logger) {
	for _, o := range outcomes {
		if o.result.Err != nil {
			unpermittedTriggersTotal.WithLabelValues(string(o.from)).Inc()
			log.Error(o.result.Err, "Unpermitted trigger", "module", o.key)
		}
		for _, t := range o.result.Fired {
			log.Info("Transition", "module", o.key, "from", t.From, "to", t.To, "trigger", t.Trigger)
		}
	}
}

func (r *NMCReconciler) pairFacts(f *nodeFacts, key string, node fsm.Node, now time.Time) fsm.Facts {
	ns, name, _ := strings.Cut(key, "/")
	facts := fsm.Facts{Now: now, BackOff: r.BackOff, Node: node, DevicePluginRunning: f.dpRunning[key], DevicePluginConfigured: f.dpModules[key],
		Status: kmmv1beta1.NodeModuleStatus{Namespace: ns, Name: name}, WorkerTimeout: r.WorkerTimeout}
	if rf, ok := f.refused[key]; ok {
		facts.CreateRefused = &rf
	}
	facts.Spec = f.nmc.SpecEntry(ns, name)
	if st := f.nmc.StatusEntry(ns, name); st != nil {
		facts.Status = *st
	}
	if f.modulesSet[key] {
		facts.Node.UpgradeTarget = f.node.Labels[kmmv1beta1.ModuleVersionLabel(ns, name)]
	}
	facts.Node.WorkerPodVersion = f.node.Labels[kmmv1beta1.WorkerPodVersionLabel(ns, name)]
	facts.UpstreamWorkerPresent = f.upstreamWorkers[key]
	facts.SpecWrittenByKMM = f.appliedByKMM[key]
	if p := f.workers[key]; p != nil {
		facts.Worker = ObserveWorker(p)
	}
	return facts
}

// maxBootIDLength bounds the boot ID read from a Node; it is copied into every status entry.
const maxBootIDLength = 64

// observeNode reads what the NMC decision needs of a node. The kernel version is bounded where it
// is used (a spec entry exists only for a kernel string kernel.CheckString accepts).
func observeNode(n *corev1.Node) fsm.Node {
	out := fsm.Node{Schedulable: !n.Spec.Unschedulable, KernelVersion: n.Status.NodeInfo.KernelVersion, BootID: n.Status.NodeInfo.BootID}
	if len(out.BootID) > maxBootIDLength {
		out.BootID = "" // not a boot ID (a UUID has 36 characters): reboots are then seen by the Ready time
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Ready, out.ReadySince = c.Status == corev1.ConditionTrue, c.LastTransitionTime.Time
		}
	}
	return out
}

// pairKeys lists the module keys with a spec entry, a status entry or a worker pod on the node.
func pairKeys(f *nodeFacts) []string {
	set := map[string]bool{}
	for _, e := range f.nmc.Spec.Modules {
		set[e.Namespace+"/"+e.Name] = true
	}
	for _, st := range f.nmc.Status.Modules {
		set[st.Namespace+"/"+st.Name] = true
	}
	for k := range f.workers {
		set[k] = true
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// labelChanges are the changes of the node's labels that fsm.NodeLabels asks for: a merge patch of
// the keys whose value changes (nil removes a label; empty when nothing changes).
func labelChanges(f *nodeFacts, outcomes []pairOutcome) map[string]any {
	facts := fsm.LabelFacts{Labels: f.node.Labels, Modules: f.moduleKeys, Pairs: make([]fsm.LabelPair, len(outcomes))}
	for i := range outcomes {
		o := &outcomes[i]
		facts.Pairs[i] = fsm.LabelPair{Key: o.key, Result: &o.result, DevicePluginRunning: f.dpRunning[o.key], DevicePluginReady: f.dpReady[o.key]}
	}
	want := fsm.NodeLabels(facts)
	patch := map[string]any{}
	for key, v := range want.Set {
		if cur, has := f.node.Labels[key]; !has || cur != v {
			patch[key] = v
		}
	}
	for _, key := range want.Remove {
		if _, has := f.node.Labels[key]; has {
			patch[key] = nil
		}
	}
	return patch
}

// requeueAfter is the earliest retry any pair asked for.
func requeueAfter(outcomes []pairOutcome) time.Duration {
	var d time.Duration
	for _, o := range outcomes {
		if r := o.result.Plan.RequeueAfter; r > 0 && (d == 0 || r < d) {
			d = r
		}
	}
	return d
}
