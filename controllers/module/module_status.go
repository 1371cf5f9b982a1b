package module

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/semantic"
)

// writeStatus computes Module.status from the scope and the device plugin DaemonSets and writes it
// only when it changed, and then at most once per StatusDelay unless its summary changed
// (statusWriteWait). A change it holds back is written by the reconcile after the wait it returns.
func (r *Reconciler) writeStatus(ctx context.Context, s *moduleScope) (time.Duration, error) {
	m := s.module
	dsList := &appsv1.DaemonSetList{}
	if err := r.Client.List(ctx, dsList, client.InNamespace(m.Namespace), client.MatchingLabels{contract.LabelManagedBy: contract.ManagedBy,
		contract.LabelModuleNamespace: m.Namespace, contract.LabelModuleName: m.Name}); err != nil {
		return 0, err
	}
	next := computeModuleStatus(s, dsList.Items, metav1.NewTime(r.clock().Now()))
	next.Rollout = m.Status.Rollout // the rollout controller's: kept as read (the update is resourceVersion-guarded)
	for state, n := range next.NodesByState {
		pairsByState.WithLabelValues(m.Namespace, m.Name, string(state)).Set(float64(n))
	}
	for _, state := range fsm.States {
		if _, ok := next.NodesByState[state]; !ok {
			pairsByState.WithLabelValues(m.Namespace, m.Name, string(state)).Set(0)
		}
	}
	for i := range next.Conditions {
		if old := meta.FindStatusCondition(m.Status.Conditions, next.Conditions[i].Type); old != nil &&
			old.Status == next.Conditions[i].Status && old.Reason == next.Conditions[i].Reason && old.Message == next.Conditions[i].Message {
			next.Conditions[i].LastTransitionTime = old.LastTransitionTime
		}
	}
	if semantic.Equal(&next, &m.Status) {
		return 0, nil
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	now := s.started
	if wait := statusWriteWait(&m.Status, &next, r.statusWrites.last(key), now); wait > 0 {
		return wait, nil
	}
	prev := m.Status.Conditions
	m.Status = next
	if err := r.Client.Status().Update(ctx, m); err != nil {
		return 0, client.IgnoreNotFound(err)
	}
	r.statusWrites.wrote(key, now)
	if ev, ok := moduleEvent(prev, next.Conditions); ok {
		r.recordModuleEvent(s, ev)
	}
	return 0, nil
}

// recordModuleEvent records a change of the Module's summary as an Event on the Module, or on its
// Namespace when that is being deleted: no new object, Events included, can be created in a
// terminating namespace; the Namespace's Event (in default) is related to the Module.
func (r *Reconciler) recordModuleEvent(s *moduleScope, ev kubeEvent) {
	if ev.reason == kmmv1beta1.ReasonNamespaceTerminating && s.namespace != nil {
		r.Recorder.Eventf(s.namespace, s.module, ev.eventType, ev.reason, "StateChanged", ev.note)
		return
	}
	r.Recorder.Eventf(s.module, nil, ev.eventType, ev.reason, "StateChanged", ev.note)
}

// statusWriteWait is how long a changed Module status waits before it is written (0: now). A
// Module's status counts every node, and while it rolls out its counters change with every pair
// that moves: they are written at most once per StatusDelay since this process last wrote
// it, measured between the starts of the reconciles that wrote (issue 22: 242 writes in a 45 s load of one Module over 1,000 nodes before). A change of its
// summary (a condition's status or reason, or the observed generation, which clients wait on) is
// written at once.
func statusWriteWait(cur, next *kmmv1beta1.ModuleStatus, last, now time.Time) time.Duration {
	if last.IsZero() || summaryChanged(cur, next) {
		return 0
	}
	return max(last.Add(StatusDelay).Sub(now), 0)
}

// summaryChanged says whether next differs from cur in its observed generation or in a condition's
// presence, status or reason (not in its message or counters).
func summaryChanged(cur, next *kmmv1beta1.ModuleStatus) bool {
	if cur.ObservedGeneration != next.ObservedGeneration || len(cur.Conditions) != len(next.Conditions) {
		return true
	}
	for _, c := range next.Conditions {
		old := meta.FindStatusCondition(cur.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason {
			return true
		}
	}
	return false
}

// statusWrites remembers when this process last wrote each Module's status; an entry goes with its
// Module, so it holds at most one per Module.
type statusWrites struct {
	mu sync.Mutex
	at map[types.NamespacedName]time.Time
}

func (w *statusWrites) last(key types.NamespacedName) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at[key]
}

func (w *statusWrites) wrote(key types.NamespacedName, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at == nil {
		w.at = map[types.NamespacedName]time.Time{}
	}
	w.at[key] = now
}

func (w *statusWrites) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.at, key)
}

// kubeEvent is a Kubernetes Event to emit.
type kubeEvent struct{ eventType, reason, note string }

// moduleEvent is the Module-level Event for a change of its conditions: a Warning with the
// Degraded reason while degraded, else a Normal Event with the Ready reason (InProgress, AllLoaded).
// It says nothing when that summary did not change, so a rollout over many nodes gives a few Events
// on the Module, not one per node.
func moduleEvent(prev, next []metav1.Condition) (kubeEvent, bool) {
	summary := func(conds []metav1.Condition) (kubeEvent, bool) {
		if d := meta.FindStatusCondition(conds, kmmv1beta1.ConditionDegraded); d != nil && d.Status == metav1.ConditionTrue {
			return kubeEvent{corev1.EventTypeWarning, d.Reason, d.Message}, true
		}
		if r := meta.FindStatusCondition(conds, kmmv1beta1.ConditionReady); r != nil {
			return kubeEvent{corev1.EventTypeNormal, r.Reason, r.Message}, true
		}
		return kubeEvent{}, false
	}
	was, hadSummary := summary(prev)
	now, ok := summary(next)
	if !ok || (hadSummary && was.eventType == now.eventType && was.reason == now.reason) {
		return kubeEvent{}, false
	}
	return now, true
}

// computeModuleStatus is pure: upstream's counters, nodes per state, and the three conditions (now
// is their transition time; writeStatus keeps the old one for a condition that did not change).
func computeModuleStatus(s *moduleScope, daemonSets []appsv1.DaemonSet, now metav1.Time) kmmv1beta1.ModuleStatus {
	m := s.module
	// The generation counts as observed only once it was fully acted on: after a failed apply the
	// previous one stays, so a client waiting on observedGeneration does not stop early.
	gen := m.Status.ObservedGeneration
	if s.actedOn {
		gen = m.Generation
	}
	st := kmmv1beta1.ModuleStatus{ObservedGeneration: gen, NodesByState: map[kmmv1beta1.ModuleState]int32{}}
	var noMapping, failing []string
	for i := range s.nodes {
		n := &s.nodes[i]
		d := s.decisions[n.Name]
		if d.Reason == fsm.ReasonNotSelected || d.Reason == fsm.ReasonModuleDeleted {
			continue
		}
		st.ModuleLoader.NodesMatchingSelectorNumber++
		if d.Reason == fsm.ReasonNoKernelMapping || d.Reason == fsm.ReasonInvalidKernel {
			noMapping = append(noMapping, n.Name)
		}
		state, desired, available := pairCounts(s.nmcs[n.Name], m, d)
		st.NodesByState[state]++
		st.ModuleLoader.DesiredNumber += desired
		st.ModuleLoader.AvailableNumber += available
		if state == kmmv1beta1.StateLoadBackOff || state == kmmv1beta1.StateUnloadBackOff {
			e := s.nmcs[n.Name].StatusEntry(m.Namespace, m.Name)
			failing = append(failing, fmt.Sprintf("%s (%s: %s)", n.Name, e.Reason, e.Message))
		}
	}
	for _, ds := range daemonSets {
		c := &st.DevicePlugin
		if ds.Labels[contract.LabelDRA] != "" {
			c = &st.DRA
		}
		c.NodesMatchingSelectorNumber = st.ModuleLoader.NodesMatchingSelectorNumber
		c.DesiredNumber += ds.Status.DesiredNumberScheduled
		c.AvailableNumber += ds.Status.NumberAvailable
	}
	problem := moduleProblem{invalid: s.invalid, refused: s.refused, handoverStuck: s.handoverStuck, namespaceTerminating: s.namespaceTerminating}
	progress, what := st.ModuleLoader, "loaded"
	if m.Spec.DevicePluginOnly() {
		// Nothing to load: Ready means the device plugin is available on every selected node
		// (desired from the selector, not from the DaemonSet's status, which lags its creation).
		progress = kmmv1beta1.DaemonSetStatus{DesiredNumber: st.ModuleLoader.NodesMatchingSelectorNumber, AvailableNumber: st.DevicePlugin.AvailableNumber}
		what = "device plugin available"
		if m.Spec.DRA != nil {
			progress.AvailableNumber, what = st.DRA.AvailableNumber, "DRA driver available"
		}
	}
	waits, imageFailing := imageWaits(s.gated)
	st.Conditions = moduleConditions(conditionFacts{problem: problem, progress: progress, what: what,
		noMapping: noMapping, failing: failing, imageWaits: waits, imageFailing: imageFailing, generation: gen, now: now})
	return st
}

// pairCounts returns a node's state for the Module and whether it is desired and available. Both
// come from this reconcile's decision for the node, not from the cached NMC spec: the cache lags the
// operator's own spec writes, and a Module just created would otherwise read "loaded on 0 of 0
// nodes" (Ready) until it caught up. Desired: the decision wants an entry; available: the pair is
// Loaded with exactly the decided config.
func pairCounts(nmc *kmmv1beta1.NodeModulesConfig, m *kmmv1beta1.Module, d fsm.SpecDecision) (kmmv1beta1.ModuleState, int32, int32) {
	var desired, available int32
	want := d.Entry
	if d.Action != fsm.SpecUpdate {
		want = nil
	}
	if want != nil {
		desired = 1
	}
	ps := nmc.StatusEntry(m.Namespace, m.Name)
	if ps == nil {
		return kmmv1beta1.StateAbsent, desired, 0
	}
	if want != nil && ps.State == kmmv1beta1.StateLoaded && ps.Config != nil && semantic.Equal(ps.Config, &want.Config) {
		available = 1
	}
	return ps.State, desired, available
}

// moduleProblem is what is wrong with a Module itself: invalid, an object derived from it refused,
// or the handover of upstream KMM's device plugin stuck (fsm.DecideHandover's message).
type moduleProblem struct {
	invalid              string
	refused              string
	handoverStuck        string
	namespaceTerminating string
}

// conditionFacts is what computeModuleStatus gathers for the Module's conditions.
type conditionFacts struct {
	// problem is what is wrong with the Module itself.
	problem moduleProblem
	// progress is the counter Ready and Progressing read: the module loader's, or the device
	// plugin's for a device-plugin-only Module; what names it in the message ("loaded").
	progress kmmv1beta1.DaemonSetStatus
	what     string
	// noMapping are the selected nodes whose kernel no mapping serves; failing the nodes whose
	// worker is in back-off, with its reason and message.
	noMapping, failing []string
	// imageWaits are the images (with their state) nodes wait for while the cluster builds or signs
	// them; imageFailing those whose build or sign failed and waits for its back-off (gate.go).
	imageWaits, imageFailing []string
	// generation and now stamp every condition (ObservedGeneration, LastTransitionTime).
	generation int64
	now        metav1.Time
}

// moduleConditions derives Ready, Progressing and Degraded (see api/v1beta1/conditions.go) from what
// is wrong with the Module, its counters and the nodes with no mapping or a failing worker.
func moduleConditions(in conditionFacts) []metav1.Condition {
	invalid := in.problem.invalid
	cond := func(t string, ok bool, reason, msg string) metav1.Condition {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: in.generation, LastTransitionTime: in.now}
	}
	allLoaded := in.progress.AvailableNumber == in.progress.DesiredNumber && len(in.failing) == 0
	ready := cond(kmmv1beta1.ConditionReady, allLoaded && invalid == "", kmmv1beta1.ReasonAllLoaded,
		fmt.Sprintf("%s on %d of %d nodes", in.what, in.progress.AvailableNumber, in.progress.DesiredNumber))
	progressing := cond(kmmv1beta1.ConditionProgressing, !allLoaded && len(in.failing) == 0 && invalid == "", kmmv1beta1.ReasonInProgress, ready.Message)
	if !allLoaded {
		ready.Reason = kmmv1beta1.ReasonInProgress
	}
	sayImageNotReady(in, allLoaded, &ready, &progressing)
	if progressing.Status != metav1.ConditionTrue {
		progressing.Reason = kmmv1beta1.ReasonAsExpected
	}
	degraded := cond(kmmv1beta1.ConditionDegraded, false, kmmv1beta1.ReasonAsExpected, "")
	switch {
	case invalid != "":
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonInvalidSpec, invalid)
		ready.Reason, ready.Message = kmmv1beta1.ReasonInvalidSpec, "the Module is invalid"
	case in.problem.namespaceTerminating != "":
		// The cause of the workers failing (PodRejected) that would otherwise show.
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonNamespaceTerminating, in.problem.namespaceTerminating)
	case in.problem.refused != "":
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonObjectRefused, in.problem.refused)
	case len(in.failing) > 0:
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonWorkerFailing, "worker failing on "+joinSorted(in.failing))
		ready.Reason = kmmv1beta1.ReasonWorkerFailing
	case len(in.imageFailing) > 0:
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonImageFailing, "image "+joinSorted(in.imageFailing))
	case in.problem.handoverStuck != "":
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonDevicePluginHandoverStuck, in.problem.handoverStuck)
	case len(in.noMapping) > 0:
		degraded = cond(kmmv1beta1.ConditionDegraded, true, kmmv1beta1.ReasonNoKernelMapping, "no kernel mapping for the kernel of "+joinSorted(in.noMapping))
	}
	return []metav1.Condition{ready, progressing, degraded}
}

// sayImageNotReady makes Ready and Progressing say ImageNotReady, naming the images, while nodes wait for
// an image the cluster builds or signs (gate.go).
func sayImageNotReady(in conditionFacts, allLoaded bool, ready, progressing *metav1.Condition) {
	if len(in.imageWaits)+len(in.imageFailing) == 0 || allLoaded {
		return
	}
	ready.Reason = kmmv1beta1.ReasonImageNotReady
	if progressing.Status == metav1.ConditionTrue {
		progressing.Reason = kmmv1beta1.ReasonImageNotReady
		progressing.Message = ready.Message + "; waiting for image " + joinSorted(append(append([]string(nil), in.imageFailing...), in.imageWaits...))
	}
}

func joinSorted(items []string) string {
	sort.Strings(items)
	if len(items) > 10 {
		items = append(items[:10], fmt.Sprintf("and %d more", len(items)-10))
	}
	return strings.Join(items, ", ")
}

// The Module side's metric (SPEC §8), registered on controller-runtime's registry and served on
// the manager's metrics endpoint; the node side registers the others (package node).
var pairsByState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kmm_pairs",
	Help: "Number of (node, module) pairs per Module and state.",
}, []string{"namespace", "module", "state"})

func init() {
	metrics.Registry.MustRegister(pairsByState)
}
