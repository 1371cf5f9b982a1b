package upgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/expectations"
	"github.com/kmm-project/kmm/internal/retry"
	"github.com/kmm-project/kmm/internal/semantic"
)

// RolloutRequeue is how often a Module whose automatic rollout is not complete is looked at again
// even without events (a safety net: node, NMC and Module events drive the rollout).
const RolloutRequeue = 30 * time.Second

// labelExpectationTTL bounds how long the rollout trusts a label it set over a cache that does not
// show it yet.
const labelExpectationTTL = 30 * time.Second

// nodeLabel names one label of one node.
type nodeLabel struct{ node, key string }

// RolloutReconciler is the automatic rollout of spec.upgradePolicy: per Module, it moves the
// user's version-module label of the selected nodes to the Module's version, a few nodes at a
// time (PlanRollout); the version label controller then carries out seed 002's flow per node.
type RolloutReconciler struct {
	Client client.Client
	// Recorder records the rollout's Events on the Module (RolloutPaused, UpgradeFailed); none when nil.
	Recorder events.EventRecorder
	// Clock dates the label expectations and the rollout's decisions (the real clock when nil).
	Clock clock.PassiveClock

	expectOnce sync.Once
	// expect holds the version-module labels this controller set until its cache shows them: the
	// next plan must count such a node as in progress, or a stale cache would let it start more
	// nodes than maxUnavailable allows.
	expect *expectations.Store[nodeLabel, string]
}

func (r *RolloutReconciler) expected() *expectations.Store[nodeLabel, string] {
	r.expectOnce.Do(func() { r.expect = expectations.New[nodeLabel, string](labelExpectationTTL) })
	return r.expect
}

func (r *RolloutReconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// SetupWithManager watches Modules, and Nodes and NMCs mapped to the automatic Modules they concern.
func (r *RolloutReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("upgrade-rollout").
		// Only automatic Modules: a reconcile of any other returns at once (issue 22: ~21,700 of them
		// per 1,000 x 3 load before these filters).
		// A Module no longer automatic passes while its status.rollout is there to clear.
		For(&kmmv1beta1.Module{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			m := o.(*kmmv1beta1.Module)
			return automatic(m) || m.Status.Rollout != nil
		}))).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.modulesOfNode), builder.WithPredicates(nodeRolloutFactsChanged())).
		Watches(&kmmv1beta1.NodeModulesConfig{}, handler.EnqueueRequestsFromMapFunc(r.modulesOfNMC)).
		// Device plugin, DRA driver and validation pods: whether a node is through.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.moduleOfPod)).
		WithOptions(controller.Options{RateLimiter: retry.Limiter()}).
		Complete(r)
}

// nodeRolloutFactsChanged passes node updates that change what PlanRollout reads: labels,
// cordon, readiness.
func nodeRolloutFactsChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !maps.Equal(o.Labels, n.Labels) ||
			o.Spec.Unschedulable != n.Spec.Unschedulable || nodeReady(o) != nodeReady(n)
	}}
}

// modulesOfNode maps a node to the automatic Modules whose selector matches it.
func (r *RolloutReconciler) modulesOfNode(ctx context.Context, o client.Object) []ctrl.Request {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules); err != nil {
		return nil
	}
	var out []ctrl.Request
	for i := range modules.Items {
		m := &modules.Items[i]
		if automatic(m) && labels.SelectorFromSet(m.Spec.Selector).Matches(labels.Set(o.GetLabels())) {
			out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)})
		}
	}
	return out
}

// moduleOfPod maps a device plugin, DRA driver or validation pod to its Module, if automatic.
func (r *RolloutReconciler) moduleOfPod(ctx context.Context, o client.Object) []ctrl.Request {
	l := o.GetLabels()
	if l[contract.LabelDevicePlugin] == "" && l[contract.LabelDRA] == "" && l[contract.LabelValidation] == "" {
		return nil
	}
	key := types.NamespacedName{Namespace: l[contract.LabelModuleNamespace], Name: l[contract.LabelModuleName]}
	m := &kmmv1beta1.Module{}
	if err := r.Client.Get(ctx, key, m, client.UnsafeDisableDeepCopy); err != nil || !automatic(m) {
		return nil
	}
	return []ctrl.Request{{NamespacedName: key}}
}

// modulesOfNMC maps an NMC to the automatic Modules of its spec and status entries.
func (r *RolloutReconciler) modulesOfNMC(ctx context.Context, o client.Object) []ctrl.Request {
	nmc := o.(*kmmv1beta1.NodeModulesConfig)
	seen := map[types.NamespacedName]bool{}
	var out []ctrl.Request
	add := func(ns, name string) {
		key := types.NamespacedName{Namespace: ns, Name: name}
		if seen[key] {
			return
		}
		seen[key] = true
		m := &kmmv1beta1.Module{}
		err := r.Client.Get(ctx, key, m, client.UnsafeDisableDeepCopy)
		if (err != nil && !apierrors.IsNotFound(err)) || (err == nil && automatic(m)) {
			out = append(out, ctrl.Request{NamespacedName: key}) // on a read error, let the reconcile decide
		}
	}
	for _, s := range nmc.Spec.Modules {
		add(s.Namespace, s.Name)
	}
	for _, s := range nmc.Status.Modules {
		add(s.Namespace, s.Name)
	}
	return out
}

// Reconcile gathers the selected nodes and their pairs, decides one rollout step, writes the
// rollout's status (then its Events) and patches the version-module labels the decision names.
func (r *RolloutReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	m := &kmmv1beta1.Module{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		if apierrors.IsNotFound(err) {
			recordMetrics(req.Namespace, req.Name, nil, nil)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !automatic(m) {
		recordMetrics(m.Namespace, m.Name, nil, nil)
		return ctrl.Result{}, r.writeRollout(ctx, m, nil)
	}
	in, err := r.gather(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	d := DecideRollout(in)
	prev := m.Status.Rollout
	if err := r.writeRollout(ctx, m, d.Status); err != nil {
		return ctrl.Result{}, err
	}
	recordMetrics(m.Namespace, m.Name, d.Status, d.OldestSince)
	r.recordEvents(m, prev, d)
	progress := d.Progress
	log := ctrl.LoggerFrom(ctx).WithValues("module", req.NamespacedName, "version", m.Spec.Version())
	key := kmmv1beta1.ModuleVersionLabel(m.Namespace, m.Name)
	for _, it := range d.Intents {
		log.Info("Moving the version-module label", "node", it.Node, "done", progress.Done, "total", progress.Total,
			"unavailable", progress.Unavailable, "maxUnavailable", progress.Budget)
		if err := r.setLabel(ctx, it.Node, key, it.Version); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.validate(ctx, m, d.Validate, in.staleValidations); err != nil {
		return ctrl.Result{}, err
	}
	if progress.Complete() {
		return ctrl.Result{}, nil
	}
	if wait := d.SoakEnds.Sub(r.now()); !d.SoakEnds.IsZero() && wait < RolloutRequeue {
		return ctrl.Result{RequeueAfter: max(wait, time.Second)}, nil
	}
	return ctrl.Result{RequeueAfter: RolloutRequeue}, nil
}

// validate creates the validation pods the decision names and deletes those of other versions.
func (r *RolloutReconciler) validate(ctx context.Context, m *kmmv1beta1.Module, nodes []string, stale []*corev1.Pod) error {
	for _, n := range nodes {
		if err := r.Client.Create(ctx, NewValidationPod(m, n)); err != nil && !apierrors.IsAlreadyExists(err) {
			if r.Recorder != nil {
				r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, "ValidationPodRefused", "Rollout", "validation pod for node %s: %v", n, err)
			}
			return fmt.Errorf("creating the validation pod for node %s: %w", n, err)
		}
	}
	for _, p := range stale {
		uid := p.UID
		if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting the validation pod %s of another version: %w", p.Name, err)
		}
	}
	return nil
}

// writeRollout writes status.rollout when it changed, guarded by the Module's resourceVersion: a
// decision taken on a stale Module (one whose pause this controller wrote and its cache does not
// show yet) fails on the conflict and is taken again, so a pause has exactly one Event.
func (r *RolloutReconciler) writeRollout(ctx context.Context, m *kmmv1beta1.Module, st *kmmv1beta1.RolloutStatus) error {
	if semantic.Equal(m.Status.Rollout, st) {
		return nil
	}
	m.Status.Rollout = st
	return client.IgnoreNotFound(r.Client.Status().Update(ctx, m))
}

// recordEvents records, after the status that says so was written, the pause at the failure budget
// (one Warning RolloutPaused) and each node newly UpgradeFailed (one Warning UpgradeFailed).
func (r *RolloutReconciler) recordEvents(m *kmmv1beta1.Module, prev *kmmv1beta1.RolloutStatus, d RolloutDecision) {
	if r.Recorder == nil {
		return
	}
	for _, n := range d.NewlyFailed {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, string(kmmv1beta1.UpgradeFailed), "Rollout",
			"node %s failed its upgrade to %s: %s: %s", n.Name, d.Status.Version, n.Reason, n.Message)
	}
	if d.UndoRefused != "" {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, "UndoRefused", "Rollout", "%s", d.UndoRefused)
	}
	if d.RollbackStarted {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, "RollbackStarted", "Rollout", "%s", rollbackMessage(d.Status.Rollback))
	}
	if d.PausedNow {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, "RolloutPaused", "Rollout", "%s", d.Status.Paused.Message)
	}
	if prev != nil && prev.Paused != nil && prev.Paused.Reason == kmmv1beta1.ReasonFailureBudgetExceeded && !d.PausedNow &&
		(d.Status.Paused == nil || d.Status.Paused.Reason != kmmv1beta1.ReasonFailureBudgetExceeded) {
		r.Recorder.Eventf(m, nil, corev1.EventTypeNormal, "RolloutResumed", "Rollout", "the rollout of %s goes on", d.Status.Version)
	}
}

// gather reads the selected nodes and their pairs' NMC status entries into a RolloutInput.
func (r *RolloutReconciler) gather(ctx context.Context, m *kmmv1beta1.Module) (RolloutInput, error) {
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingLabels(m.Spec.Selector)); err != nil {
		return RolloutInput{}, err
	}
	r.expected().Prune(r.now())
	in := RolloutInput{Module: m, Nodes: make([]RolloutNode, 0, len(nodes.Items)), Now: r.now()}
	pods, err := r.modulePods(ctx, m)
	if err != nil {
		return RolloutInput{}, err
	}
	in.staleValidations = pods.stale
	for i := range nodes.Items {
		n := &nodes.Items[i]
		rn := RolloutNode{Name: n.Name, Labels: r.withExpectedLabel(n, kmmv1beta1.ModuleVersionLabel(m.Namespace, m.Name)),
			Ready: nodeReady(n), Unschedulable: n.Spec.Unschedulable}
		nmc := &kmmv1beta1.NodeModulesConfig{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: n.Name}, nmc); client.IgnoreNotFound(err) != nil {
			return RolloutInput{}, err
		}
		pairFacts(&rn, nmc.StatusEntry(m.Namespace, m.Name))
		rn.KernelVersion = n.Status.NodeInfo.KernelVersion
		rn.DevicePluginPending = (m.Spec.DevicePlugin != nil || m.Spec.DRA != nil) && !pods.pluginReady[n.Name]
		if p := pods.validation[n.Name]; p != nil {
			rn.Validation = ObserveValidation(p)
		}
		in.Nodes = append(in.Nodes, rn)
	}
	return in, nil
}

// pairFacts reads what the rollout needs of the pair's NMC status entry (nil: none).
func pairFacts(rn *RolloutNode, st *kmmv1beta1.NodeModuleStatus) {
	if st == nil {
		return
	}
	rn.State, rn.Reason, rn.Message, rn.Since = st.State, st.Reason, st.Message, st.LastTransitionTime.Time
	rn.CordonedByKMM = st.Drain != nil && st.Drain.CordonedByKMM
	if st.Drain != nil {
		rn.DrainStart = st.Drain.StartTime.Time
	}
	if st.Config != nil {
		rn.LoadedVersion = st.Config.Version
		rn.Running = &kmmv1beta1.PreviousConfig{Config: *st.Config.DeepCopy(), ServiceAccountName: st.ServiceAccountName,
			ImageRepoSecret: st.ImageRepoSecret.DeepCopy(), Tolerations: slices.Clone(st.Tolerations)}
	}
}

// rolloutPods are the Module's pods the rollout reads, by node.
type rolloutPods struct {
	// pluginReady: a Ready device plugin or DRA driver pod of the Module is on the node.
	pluginReady map[string]bool
	// validation is the node's validation pod of the Module's version.
	validation map[string]*corev1.Pod
	// stale are validation pods of other versions.
	stale []*corev1.Pod
}

// modulePods reads the Module's device plugin, DRA driver and validation pods from the cache.
func (r *RolloutReconciler) modulePods(ctx context.Context, m *kmmv1beta1.Module) (rolloutPods, error) {
	list := &corev1.PodList{}
	out := rolloutPods{pluginReady: map[string]bool{}, validation: map[string]*corev1.Pod{}}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace),
		client.MatchingLabels{contract.LabelModuleNamespace: m.Namespace, contract.LabelModuleName: m.Name}); err != nil {
		return out, err
	}
	for i := range list.Items {
		p := &list.Items[i]
		switch l := p.Labels; {
		case l[contract.LabelValidation] != "" && l[contract.LabelVersion] == m.Spec.Version():
			out.validation[p.Spec.NodeName] = p
		case l[contract.LabelValidation] != "":
			out.stale = append(out.stale, p)
		case (l[contract.LabelDevicePlugin] != "" || l[contract.LabelDRA] != "") && podReady(p):
			out.pluginReady[p.Spec.NodeName] = true
		}
	}
	return out, nil
}

// podReady says whether a pod runs with its Ready condition true and is not being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// withExpectedLabel returns the node's labels with the value this controller last set under key
// when the cache does not show it yet, and forgets that expectation once the cache does.
func (r *RolloutReconciler) withExpectedLabel(n *corev1.Node, key string) map[string]string {
	k := nodeLabel{node: n.Name, key: key}
	r.expected().Observed(k, func(v string) bool { return n.Labels[key] == v })
	v, ok := r.expected().Get(k, r.now())
	if !ok {
		return n.Labels
	}
	out := maps.Clone(n.Labels)
	if out == nil {
		out = map[string]string{}
	}
	out[key] = v
	return out
}

// setLabel merge-patches one label of a node and expects it until the cache shows it.
func (r *RolloutReconciler) setLabel(ctx context.Context, nodeName, key, value string) error {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{key: value}}})
	if err != nil {
		return err
	}
	n := &corev1.Node{}
	n.Name = nodeName
	if err := r.Client.Patch(ctx, n, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("setting %s=%s on node %s: %w", key, value, nodeName, err)
	}
	r.expected().Expect(nodeLabel{node: nodeName, key: key}, value, r.now())
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// rollbackMessage says what a rollback does.
func rollbackMessage(rb *kmmv1beta1.RolloutRollback) string {
	if rb.Reason == kmmv1beta1.ReasonRollbackUndo {
		return fmt.Sprintf("rollout undo: every node goes back to %s, maxUnavailable at a time; set the Module's version to %s to keep it, or kubectl kmm rollout resume to roll out again", rb.Version, rb.Version)
	}
	return fmt.Sprintf("the failed nodes %v go back to %s (upgradePolicy.rollbackFailed)", rb.Nodes, rb.Version)
}
