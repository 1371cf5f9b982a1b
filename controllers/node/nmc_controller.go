package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/expectations"
	"github.com/kmm-project/kmm/internal/podindex"
	"github.com/kmm-project/kmm/internal/retry"
	"github.com/kmm-project/kmm/internal/semantic"
)

// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=nodemodulesconfigs,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=nodemodulesconfigs/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get

// NMCReconciler is the NMC controller: one reconcile per node.
type NMCReconciler struct {
	Client client.Client
	// APIReader reads what the cache does not hold: workload pods and PodDisruptionBudgets during
	// an upgrade drain.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Clock     clock.PassiveClock
	// Worker are the operator's settings of every worker pod: image, dry-run sandbox, firmware,
	// registry configuration. ServiceAccountPullSecrets is filled in per pod, from the pod's
	// service account.
	Worker  WorkerPodOptions
	BackOff fsm.BackOff
	// WorkerTimeout is how long a worker pod may run before the pair fails it (0: fsm.DefaultWorkerTimeout).
	WorkerTimeout time.Duration
	// MaxConcurrentReconciles may be above 1: each NMC is one node, so reconciles never share state
	// (but for the pod expectations, which are per pod and locked).
	MaxConcurrentReconciles int
	// CoalesceWindow is how long a new NMC, a spec change or a worker pod's update waits before the
	// node is reconciled (coalesce.go; 0: not at all, the operator runs DefaultCoalesceWindow).
	CoalesceWindow time.Duration

	expectOnce    sync.Once
	expect        *podExpectations
	labelPatches  *expectations.Store[string, patchedNode] // by node name (ownlabels.go)
	conflicts     shared.ConflictRetry
	saPullSecrets saPullSecretsCache
}

// expected returns the reconciler's pod expectations, created on first use.
func (r *NMCReconciler) expected() *podExpectations {
	r.expectOnce.Do(func() {
		r.expect, r.labelPatches = newPodExpectations(), expectations.New[string, patchedNode](expectationTTL)
	})
	return r.expect
}

// SetupWithManager registers the controller: NMCs, their Nodes, and kmm's pods on the node.
func (r *NMCReconciler) SetupWithManager(mgr ctrl.Manager) error {
	byNodeName := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []ctrl.Request {
		return []ctrl.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
	})
	// Measured in issue 22: giving the node of a finished worker pod a higher queue priority finished
	// the first pairs sooner at 1,000 x 3 but batched fewer pairs per NMC status write and node patch
	// (1.22 and 0.71 per pair instead of 0.99 and 0.59) and was not faster in all: plain FIFO stays.
	// New spec entries and worker pod updates wait a short window instead (coalesce.go).
	if err := podindex.Register(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("nmc").
		Watches(&kmmv1beta1.NodeModulesConfig{}, r.nmcEvents()).
		Watches(&corev1.Node{}, byNodeName, builder.WithPredicates(nodeEvents())).
		Watches(&corev1.Pod{}, r.podEvents()).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1), RateLimiter: retry.Limiter()}).
		Complete(r)
}

// nodeFacts is everything read for one reconcile. The NMC and the Node are the cache's own
// objects until a write needs them (writableNMC, writableNode): a no-op reconcile copies nothing.
type nodeFacts struct {
	nmc        *kmmv1beta1.NodeModulesConfig
	node       *corev1.Node
	nmcCopied  bool
	nodeCopied bool
	workers    map[string]*corev1.Pod // by module key
	dpRunning  map[string]bool        // by module key
	dpReady    map[string]bool        // by module key: a device plugin pod is Ready
	dpModules  map[string]bool        // module keys whose Module has a device plugin or a DRA driver
	draReady   map[string]bool        // by module key: a DRA driver pod is Ready
	draPods    map[string][]*corev1.Pod
	drivers    map[string]string // by module key: the DRA driver name of a Module with spec.dra
	// claims are the ResourceClaims read once per reconcile, only when a pair of a Module with a
	// DRA driver may unload (nil: not read yet).
	claims []resourcev1.ResourceClaim
	// nodePods are the pods on the node, read once per reconcile for a drain with deviceUsers
	// (nil: not read yet).
	nodePods   []*corev1.Pod
	modulesSet map[string]bool // module keys whose Module exists and is not being deleted
	moduleKeys map[string]bool // module keys of every Module, being deleted or not
	drains     map[string]*kmmv1beta1.DrainSpec
	refused    map[string]fsm.CreateRefusal // worker pods the API server refused, by module key
	// upstreamWorkers are the module keys with an upstream KMM worker pod on the node, read only
	// when the NMC has a record upstream left (takeover.go).
	upstreamWorkers map[string]bool
	// appliedByKMM says, by module key, whether the Module's own manager applied its spec entry, read
	// from the NMC as stored (the cache strips managedFields) only when the NMC has a record upstream left.
	appliedByKMM map[string]bool
	// upstreamDevicePlugins says a pod of upstream KMM's device plugin holds back an unload on the
	// node (handover.go): the node is looked at again, as those pods are not watched.
	upstreamDevicePlugins bool
	// pluginsReadLive says the device plugin and DRA driver pod facts come from a live read
	// (liveplugins.go), not the cache.
	pluginsReadLive bool
}

// writableNMC returns the NMC to write: a copy of the cached one, made once.
func (f *nodeFacts) writableNMC() *kmmv1beta1.NodeModulesConfig {
	if !f.nmcCopied {
		f.nmc, f.nmcCopied = f.nmc.DeepCopy(), true
	}
	return f.nmc
}

// writableNode returns the Node to patch (the client decodes the answer into it): a copy of the
// cached one, made once.
func (f *nodeFacts) writableNode() *corev1.Node {
	if !f.nodeCopied {
		f.node, f.nodeCopied = f.node.DeepCopy(), true
	}
	return f.node
}

// pairOutcome is the decision for one pair with what the reconciler needs to carry it out.
type pairOutcome struct {
	key    string
	result fsm.Result
	pod    *corev1.Pod
	// worker is pod as ObserveWorker read it (its termination message parsed once), zero without a pod.
	worker fsm.Worker
	// from is the pair's stored state before the decision.
	from kmmv1beta1.ModuleState
}

// Reconcile gathers the node's facts, decides every pair, writes the NMC status once and executes;
// a reconcile that met only conflicts is retried quietly.
func (r *NMCReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	return r.conflicts.Result(ctx, req, res, err)
}

// reconcile is one pass over a node, in four steps: gather the node's facts, decide every pair and
// the node's labels (fsm, pure), write the NMC status once, execute the plans.
func (r *NMCReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("node", req.Name)
	f, err := r.gather(ctx, req.Name)
	if err != nil || f == nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	d, err := r.decide(ctx, f, r.Clock.Now())
	if err != nil {
		return ctrl.Result{}, err
	}
	logOutcomes(d.outcomes, log)
	if err := r.writeStatus(ctx, f, d); err != nil {
		// A conflict means the NMC changed since it was read: the error requeues with back-off and the
		// next reconcile decides on fresh facts.
		return ctrl.Result{}, err
	}
	r.record(f, d.outcomes)
	if err := r.execute(ctx, f, d, log); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: d.requeueAfter}, nil
}

func (r *NMCReconciler) gather(ctx context.Context, name string) (*nodeFacts, error) {
	f := &nodeFacts{nmc: &kmmv1beta1.NodeModulesConfig{}, node: &corev1.Node{}, workers: map[string]*corev1.Pod{},
		dpRunning: map[string]bool{}, dpReady: map[string]bool{}, dpModules: map[string]bool{}, draReady: map[string]bool{},
		draPods: map[string][]*corev1.Pod{}, drivers: map[string]string{}, modulesSet: map[string]bool{}, moduleKeys: map[string]bool{}, refused: map[string]fsm.CreateRefusal{}}
	// Everything is read as the cache holds it, without copies (this runs for every event on every
	// node); the writes copy the NMC or the Node first (writableNMC, writableNode).
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, f.nmc, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, f.node, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	r.overlayLabelPatch(f, r.Clock.Now())
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.MatchingLabels{contract.LabelManagedBy: contract.ManagedBy},
		client.MatchingFields{contract.PodNodeNameField: name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		collectPod(f, &pods.Items[i], name)
	}
	r.expected().fill(f, name, r.Clock.Now())
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	for _, m := range modules.Items {
		f.moduleKeys[m.Namespace+"/"+m.Name] = true
		f.dpModules[m.Namespace+"/"+m.Name] = m.Spec.DevicePlugin != nil || m.Spec.DRA != nil
		if m.Spec.DRA != nil {
			f.drivers[m.Namespace+"/"+m.Name] = m.Spec.DRA.DriverName
		}
		if m.DeletionTimestamp.IsZero() {
			f.modulesSet[m.Namespace+"/"+m.Name] = true
		}
	}
	f.drains = drainPolicies(modules.Items)
	if hasUpstreamRecord(f.nmc) && r.APIReader != nil {
		if err := r.gatherUpstream(ctx, f); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// collectPod files a kmm pod on node under its module.
func collectPod(f *nodeFacts, p *corev1.Pod, node string) {
	if p.Spec.NodeName != node {
		return
	}
	if isWorkerPod(p) {
		f.workers[p.Labels[contract.LabelModuleNamespace]+"/"+p.Labels[contract.LabelModuleName]] = p
		return
	}
	// A device plugin or DRA driver pod counts until it is gone, Terminating included: it may
	// still use the module.
	if podEnded(p) {
		return
	}
	key := p.Labels[contract.LabelModuleNamespace] + "/" + p.Labels[contract.LabelModuleName]
	switch {
	case p.Labels[contract.LabelDevicePlugin] != "":
		f.dpRunning[key] = true
		f.dpReady[key] = f.dpReady[key] || shared.PodReady(p)
	case p.Labels[contract.LabelDRA] != "":
		f.dpRunning[key] = true
		f.draReady[key] = f.draReady[key] || shared.PodReady(p)
		f.draPods[key] = append(f.draPods[key], p)
	}
}

// hasUpstreamRecord says whether an NMC has a status entry upstream KMM left (fsm.UpstreamRecord).
func hasUpstreamRecord(nmc *kmmv1beta1.NodeModulesConfig) bool {
	for i := range nmc.Status.Modules {
		if fsm.UpstreamRecord(&nmc.Status.Modules[i]) {
			return true
		}
	}
	return false
}

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
	if err := r.readPluginsLive(ctx, f, node, now); err != nil {
		return nil, err
	}
	var out []pairOutcome
	for _, key := range pairKeys(f) {
		facts := r.pairFacts(f, key, node, now)
		claims, err := r.claimFacts(ctx, f, key, &facts)
		if err != nil {
			return nil, fmt.Errorf("reading the ResourceClaims of %s: %w", key, err)
		}
		facts.Claims = claims
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
		facts.Pairs[i] = fsm.LabelPair{Key: o.key, Result: &o.result, DevicePluginRunning: f.dpRunning[o.key], DevicePluginReady: f.dpReady[o.key],
			DRAReady: f.draReady[o.key]}
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

// writeStatus writes the NMC status once when it changed, or when the reconcile is about to act on
// what the decision read: create a pod, change the node's labels, cordon, drain or
// uncordon. A write with the read resourceVersion proves the decision was made on fresh data: from a
// cache that lags the last status write, a decision would otherwise put back the ready label of a
// pair that is already unloading, and the device plugin with it (found by the rapid model of
// issue 19).
func (r *NMCReconciler) writeStatus(ctx context.Context, f *nodeFacts, d decision) error {
	next := make([]kmmv1beta1.NodeModuleStatus, 0, len(d.outcomes))
	acts := len(d.labels) > 0
	for _, o := range d.outcomes {
		if o.result.Status != nil {
			next = append(next, *o.result.Status)
		}
		p := o.result.Plan
		acts = acts || p.CreateWorker != nil || p.Drain != nil || p.Uncordon
	}
	if semantic.Equal(&next, &f.nmc.Status.Modules) && !acts {
		return nil
	}
	nmc := f.writableNMC()
	nmc.Status.Modules = next
	return r.Client.Status().Update(ctx, nmc)
}

// podWritesAtOnce bounds the pairs whose worker pods one reconcile deletes and creates at once.
const podWritesAtOnce = 8

// execute carries out the decision: the drains, then, side by side, the node's labels and each
// pair's finished pod and new pod; the NMC's deletion once nothing is left on it. The pairs' pod
// writes and the label patch do not wait on each other (issue 41, round four: one at a time, a
// reconcile of three pairs was five round trips, and the NMC workers waited on them): a failed
// label patch never held back the pods.
func (r *NMCReconciler) execute(ctx context.Context, f *nodeFacts, d decision, log logr.Logger) error {
	// The drains go before the labels: a DRA driver pod a drain evicts is gone through the
	// Eviction API before its DaemonSet stops selecting the node (the DaemonSet controller would
	// otherwise delete it first, without the disruption the eviction records).
	var errs []error
	for _, o := range d.outcomes {
		errs = append(errs, r.executeDrain(ctx, f, o.key, o.result.Plan))
	}
	setDrainGauge(f.node.Name, d.outcomes)
	name := f.node.Name
	writes := []func() error{func() error {
		if err := r.patchLabels(ctx, f, d.labels); err != nil {
			return fmt.Errorf("labelling node %s: %w", name, err)
		}
		return nil
	}}
	for _, o := range d.outcomes {
		if o.result.Plan.DeleteWorker || o.result.Plan.CreateWorker != nil {
			writes = append(writes, func() error { return r.executePods(ctx, name, o, log) })
		}
	}
	// The label patch takes the first slot; the pairs share the others.
	errs = append(errs, shared.RunConcurrently(writes, make(chan struct{}, 1+podWritesAtOnce)))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return r.deleteIfEmpty(ctx, f)
}

// executePods deletes the pair's finished worker pod and creates its new one, as planned.
func (r *NMCReconciler) executePods(ctx context.Context, node string, o pairOutcome, log logr.Logger) error {
	p := o.result.Plan
	var errs []error
	if p.DeleteWorker && o.pod != nil && !r.expected().deleting(o.pod.UID, r.Clock.Now()) {
		log.V(1).Info("Deleting finished worker pod", "module", o.key, "pod", o.pod.Name)
		pre := client.Preconditions{UID: &o.pod.UID}
		if o.pod.Status.Phase != corev1.PodSucceeded && o.pod.Status.Phase != corev1.PodFailed {
			// An overdue pod: delete it only as it was seen, not if it finished since.
			pre.ResourceVersion = &o.pod.ResourceVersion
		}
		err := shared.IgnoreGone(r.Client.Delete(ctx, o.pod, pre))
		if err == nil {
			r.expected().deleted(o.pod.UID, r.Clock.Now())
		}
		errs = append(errs, err)
	}
	if p.CreateWorker != nil {
		log.Info("Creating worker pod", "module", o.key, "action", p.CreateWorker.Action, "attempt", p.CreateWorker.Attempt)
		errs = append(errs, r.createWorker(ctx, node, o.key, p.CreateWorker))
	}
	return errors.Join(errs...)
}

func (r *NMCReconciler) createWorker(ctx context.Context, node, key string, in *fsm.WorkerIntent) error {
	saSecrets, err := r.saPullSecrets.get(ctx, r.APIReader, r.Clock, in.Entry.Namespace, in.Entry.ServiceAccountName)
	if err != nil {
		// No pod without the service account's pull secrets: the next reconcile fails the attempt
		// (status reason ServiceAccountUnreadable, an Event) and backs off; the read is tried again
		// at the next attempt (failed reads are not remembered).
		r.expected().refusedCreate(node, key, fsm.CreateRefusal{Action: in.Action, Attempt: in.Attempt,
			Reason: fsm.ReasonServiceAccountUnreadable, Message: err.Error()})
		return fmt.Errorf("the %s worker pod for %s on %s: %w", in.Action, key, node, err)
	}
	opts := r.Worker
	opts.ServiceAccountPullSecrets = saSecrets
	pod, err := WorkerPod(node, opts, in)
	if err != nil {
		r.expected().refusedCreate(node, key, fsm.CreateRefusal{Action: in.Action, Attempt: in.Attempt, Message: err.Error()})
		return fmt.Errorf("building the %s worker pod for %s on %s: %w", in.Action, key, node, err)
	}
	if err := r.Client.Create(ctx, pod); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		if shared.RefusedForGood(err) {
			// The same pod would be refused again: the next reconcile fails the attempt (status
			// reason PodRejected, an Event) and backs off.
			r.expected().refusedCreate(node, key, fsm.CreateRefusal{Action: in.Action, Attempt: in.Attempt, Message: err.Error()})
		}
		return fmt.Errorf("creating the %s worker pod for %s on %s: %w", in.Action, key, node, err)
	}
	r.expected().created(pod, r.Clock.Now())
	return nil
}

// patchLabels writes the node label changes, when there are any.
func (r *NMCReconciler) patchLabels(ctx context.Context, f *nodeFacts, patch map[string]any) error {
	if len(patch) == 0 {
		return nil
	}
	from := f.node.ResourceVersion
	node := f.writableNode()
	if err := r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, labelsPatch(patch))); err != nil {
		return err
	}
	r.rememberLabelPatch(from, node, r.Clock.Now())
	return nil
}

// labelsPatch is a JSON merge patch of node labels (nil values remove a label).
func labelsPatch(labels map[string]any) []byte {
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	return data
}

// deleteIfEmpty removes an NMC that has no spec entry, no status entry and no worker pod left;
// the resourceVersion precondition makes it lose any race with a new spec entry.
func (r *NMCReconciler) deleteIfEmpty(ctx context.Context, f *nodeFacts) error {
	if len(f.nmc.Spec.Modules) > 0 || len(f.nmc.Status.Modules) > 0 || len(f.workers) > 0 {
		return nil
	}
	rv := f.nmc.ResourceVersion
	return shared.IgnoreGone(r.Client.Delete(ctx, f.nmc, client.Preconditions{ResourceVersion: &rv}))
}
