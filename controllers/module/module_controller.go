package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/retry"
	"github.com/kmm-project/kmm/internal/semantic"
	"github.com/kmm-project/kmm/internal/validation"
)

// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules/finalizers,verbs=update
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=nodemodulesconfigs,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=moduleimagesconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete

// Finalizer holds a Module until no node has it loaded.
const Finalizer = "kmm.sigs.x-k8s.io/unload"

// Reconciler is the Module→NMC controller.
type Reconciler struct {
	Client client.Client
	// APIReader reads NMCs as stored, managedFields included (the cache strips them), when an NMC
	// is taken over from upstream KMM; nil means Client.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Clock gives the conditions' transition times; nil means the real clock.
	Clock clock.PassiveClock
	// HandoverTimeout bounds the handover of upstream KMM's device plugin (0: fsm.DefaultHandoverTimeout).
	HandoverTimeout time.Duration
	// OrphanGrace is how long a spec entry of a Module that does not exist is kept (0: fsm.DefaultOrphanGrace).
	OrphanGrace time.Duration

	conflicts    shared.ConflictRetry
	statusWrites statusWrites
	orphans      orphanSeen
	writersOnce  sync.Once
	writerSlots  chan struct{}
}

func (r *Reconciler) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

// SetupWithManager registers the controller: Modules, the Nodes their selectors match (label and
// kernel changes only: this controller never reads node status), NMCs and device plugin DaemonSets.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("module").
		For(&kmmv1beta1.Module{}, builder.WithPredicates(predicate.Not(statusOnlyUpdate()))).
		Watches(&kmmv1beta1.Module{}, delayedStatusUpdates(), builder.WithPredicates(statusOnlyUpdate())).
		Owns(&appsv1.DaemonSet{}).
		Watches(&resourcev1.DeviceClass{}, handler.EnqueueRequestsFromMapFunc(deviceClassModule)).
		Watches(&corev1.Node{}, r.nodeEvents(), builder.WithPredicates(nodeLabelsOrKernelChanged())).
		Watches(&kmmv1beta1.NodeModulesConfig{}, nmcEvents()).
		// The image controller's MIC status opens the image gate (gate.go).
		Watches(&kmmv1beta1.ModuleImagesConfig{}, handler.EnqueueRequestsFromMapFunc(micModule)).
		Watches(&corev1.Namespace{}, r.modulesOfNamespace(), builder.WithPredicates(namespaceDeletedOrRelabelled())).
		WithOptions(controller.Options{RateLimiter: retry.Limiter(), MaxConcurrentReconciles: Concurrency}).
		Complete(r)
}

// micModule is the Module of a ModuleImagesConfig (same namespace and name).
func micModule(_ context.Context, o client.Object) []ctrl.Request {
	return []ctrl.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
}

// deviceClassModule is the Module a DeviceClass's labels name (kmm's or upstream KMM's), if any: a
// change made to it by hand is put back.
func deviceClassModule(_ context.Context, o client.Object) []ctrl.Request {
	l := o.GetLabels()
	ns, name := l[contract.LabelModuleNamespace], l[contract.LabelModuleName]
	if ns == "" || name == "" {
		ns, name = l[shared.UpstreamModuleNamespaceLabel], l[shared.UpstreamModuleNameLabel]
	}
	if ns == "" || name == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}

// StatusDelay is how long NMC changes gather before their Modules are reconciled again: a
// Module's status counts every node, so one reconcile per NMC change (thousands while a Module
// rolls out) would recompute it, and often write it, thousands of times. Module and Node changes
// are not delayed.
const StatusDelay = time.Second

// nmcEvents enqueues the Modules an NMC names (before and after the change) StatusDelay
// later; the queue merges the requests for a Module that wait.
func nmcEvents() handler.Funcs {
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		for _, o := range objs {
			for _, req := range modulesInNMC(context.Background(), o) {
				q.AddAfter(req, StatusDelay)
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.Object)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.Object)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, e.Object)
		},
	}
}

// statusOnlyUpdate passes the Module updates that change nothing but its status (and the
// resourceVersion): the controller's own status writes, mostly.
func statusOnlyUpdate() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld, e.ObjectNew
			oldRefs, newRefs := o.GetOwnerReferences(), n.GetOwnerReferences()
			return o.GetGeneration() == n.GetGeneration() && o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) &&
				maps.Equal(o.GetLabels(), n.GetLabels()) && maps.Equal(o.GetAnnotations(), n.GetAnnotations()) &&
				slices.Equal(o.GetFinalizers(), n.GetFinalizers()) && semantic.Equal(&oldRefs, &newRefs)
		},
	}
}

// delayedStatusUpdates enqueues a Module whose status alone changed StatusDelay later, like
// an NMC change: each status write would otherwise be followed at once by a reconcile that counts
// the nodes again and, while pairs move, writes again (issue 22). A status someone else changed is
// still put right, a second later.
func delayedStatusUpdates() handler.Funcs {
	return handler.Funcs{UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		q.AddAfter(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.ObjectNew)}, StatusDelay)
	}}
}

// nodeLabelsOrKernelChanged drops Node updates that change neither labels nor the kernel.
func nodeLabelsOrKernelChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !maps.Equal(o.Labels, n.Labels) || o.Status.NodeInfo.KernelVersion != n.Status.NodeInfo.KernelVersion
	}}
}

// nodeEvents enqueues the Modules a Node event concerns: for a new or deleted Node, every Module
// selecting it (and every Module being deleted); for an update, only those nodeChangeRequests
// names.
func (r *Reconciler) nodeEvents() handler.Funcs {
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs []ctrl.Request) {
		for _, req := range reqs {
			q.Add(req)
		}
	}
	whole := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if modules, ok := r.modules(ctx); ok {
			add(q, nodeChangeRequests(modules, nil, o.GetLabels(), true))
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			whole(ctx, e.Object, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			whole(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			whole(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			modules, ok := r.modules(ctx)
			if !ok {
				return
			}
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			add(q, nodeChangeRequests(modules, o.Labels, n.Labels, o.Status.NodeInfo.KernelVersion != n.Status.NodeInfo.KernelVersion))
		},
	}
}

// modules lists the cached Modules (their objects, not copies: only read).
func (r *Reconciler) modules(ctx context.Context) ([]kmmv1beta1.Module, bool) {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules, client.UnsafeDisableDeepCopy); err != nil {
		return nil, false
	}
	return modules.Items, true
}

// nodeChangeRequests are the Modules a change of a Node's labels (from old to next; old nil for a
// new or deleted Node, which concerns every Module selecting it) or of its kernel concerns: every
// Module being deleted, every Module the change selects or deselects, and every Module selecting
// the node when its kernel or a label changed — but for the labels the NMC controller writes for
// kmm's pairs as they load and unload (kmmv1beta1.StateLabels: ready, version.ready,
// device-plugin-ready). No Module decision reads those but through a selector, which the
// selects/deselects test above still catches: fsm.DecideSpec reads the selector's labels and the
// version-worker-pod label, the device plugin DaemonSets the version-schedule-pod label and its legacy
// name (fsm.KeepOldDevicePlugin, fsm.DevicePluginVersionKey), the Module's status only the decisions and the NMC statuses (whose
// own events queue the Module). Each of them queued the Module again before (issue 22: 1,000 times
// in a 1,000-node load for the ready label alone, and the reconcile reads every node and NMC).
func nodeChangeRequests(modules []kmmv1beta1.Module, old, next map[string]string, kernelChanged bool) []ctrl.Request {
	kmmWrites := make(map[string]bool, 3*len(modules))
	for i := range modules {
		for _, l := range kmmv1beta1.StateLabels(modules[i].Namespace, modules[i].Name) {
			kmmWrites[l] = true
		}
	}
	changed := old == nil || kernelChanged || labelsChangedBeyond(old, next, kmmWrites)
	var out []ctrl.Request
	for i := range modules {
		m := &modules[i]
		sel := labels.SelectorFromSet(m.Spec.Selector)
		selects := sel.Matches(labels.Set(next))
		if !m.DeletionTimestamp.IsZero() || (selects && changed) || (old != nil && selects != sel.Matches(labels.Set(old))) {
			out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Name}})
		}
	}
	return out
}

// labelsChangedBeyond says whether a label other than those of ignore was added, removed or changed.
func labelsChangedBeyond(old, next map[string]string, ignore map[string]bool) bool {
	for k, v := range next {
		if w, ok := old[k]; (!ok || w != v) && !ignore[k] {
			return true
		}
	}
	for k := range old {
		if _, ok := next[k]; !ok && !ignore[k] {
			return true
		}
	}
	return false
}

func modulesInNMC(_ context.Context, o client.Object) []ctrl.Request {
	nmc := o.(*kmmv1beta1.NodeModulesConfig)
	set := map[types.NamespacedName]bool{}
	for _, e := range nmc.Spec.Modules {
		set[types.NamespacedName{Namespace: e.Namespace, Name: e.Name}] = true
	}
	for _, st := range nmc.Status.Modules {
		set[types.NamespacedName{Namespace: st.Namespace, Name: st.Name}] = true
	}
	out := make([]ctrl.Request, 0, len(set))
	for k := range set {
		out = append(out, ctrl.Request{NamespacedName: k})
	}
	return out
}

// Reconcile writes the Module's NMC spec entries, its device plugin DaemonSet and its status, in
// the shape of the NMC reconciler: gather the facts, decide (pure), act, write the status once. A
// reconcile that met only conflicts is retried quietly.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	return r.conflicts.Result(ctx, req, res, err)
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("module", req.String())
	m := &kmmv1beta1.Module{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		if apierrors.IsNotFound(err) {
			r.statusWrites.forget(req.NamespacedName)
			if err := r.unlabelNamespace(ctx, req.Namespace); err != nil {
				return ctrl.Result{}, err
			}
			// NMC events bring the keys of their entries here: an entry of a Module that does not
			// exist is removed after a grace (takeover.go).
			return r.removeOrphanedEntries(ctx, req.NamespacedName)
		}
		return ctrl.Result{}, err
	}
	r.orphans.forget(req.NamespacedName)
	// The finalizer comes before any entry is written, so that a deletion always unloads.
	if m.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(m, Finalizer) {
		if err := r.patchFinalizers(ctx, m, controllerutil.AddFinalizer); err != nil {
			return ctrl.Result{}, err
		}
	}
	started := r.clock().Now()
	scope, err := r.gather(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	scope.started = started
	if err := r.syncNamespace(ctx, scope); err != nil {
		return ctrl.Result{}, err
	}
	scope.decide()
	errs := r.act(ctx, scope, log)
	scope.actedOn = errors.Join(errs...) == nil
	// A refusal for what the object is will not pass by itself: the status and an Event say so
	// (the error still requeues with back-off, for a refusal that a policy change lifts).
	scope.refused = refusalMessage(errs...)
	statusWait, err := r.writeStatus(ctx, scope)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	res := ctrl.Result{RequeueAfter: statusWait}
	if poll := handoverPoll(scope); poll > 0 && (res.RequeueAfter == 0 || res.RequeueAfter > poll) {
		res.RequeueAfter = poll // upstream's device plugin pods are not watched
	}
	return res, r.releaseWhenUnloaded(ctx, scope, log)
}

// handoverPoll is when a Module whose upstream device plugin DaemonSets still exist is looked at
// again (0: it has none).
func handoverPoll(s *moduleScope) time.Duration {
	switch {
	case !s.handoverPending:
		return 0
	case s.handoverStuck != "":
		return HandoverStuckPoll
	}
	return HandoverPoll
}

// reader reads what kmm's cache does not hold (managedFields, upstream KMM's pods).
func (r *Reconciler) reader() client.Reader {
	if r.APIReader == nil {
		return r.Client
	}
	return r.APIReader
}

// act writes what the decisions ask for: the NMC spec entries and the device plugin DaemonSet. An
// invalid Module's nodes are left as they are.
func (r *Reconciler) act(ctx context.Context, s *moduleScope, log logr.Logger) []error {
	if s.invalid != "" {
		log.Info("Invalid Module: leaving its nodes as they are", "error", s.invalid)
		return nil
	}
	errs := []error{r.syncSpecs(ctx, s, log), r.syncDevicePlugin(ctx, s), r.syncDRA(ctx, s)}
	// After kmm's device plugin DaemonSet is written: upstream KMM's goes once kmm's serves its nodes.
	pending, err := r.handOverDevicePlugin(ctx, s)
	s.handoverPending = pending
	if s.handoverMessage != "" {
		log.Info("Handing the device plugin over from upstream KMM", "waiting", s.handoverMessage)
	}
	return append(errs, err)
}

// refusalMessage is the message of the first error the API server gave for what an object is, "" when none.
func refusalMessage(errs ...error) string {
	for _, err := range errs {
		if err != nil && shared.RefusedForGood(err) {
			return head(err.Error(), 1024)
		}
	}
	return ""
}

// head is at most the first n bytes of s, cut on a character boundary, and "…" when cut.
func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// moduleScope is what one Module reconcile read and decided.
type moduleScope struct {
	module    *kmmv1beta1.Module
	nodes     []corev1.Node
	nmcs      map[string]*kmmv1beta1.NodeModulesConfig
	decisions map[string]fsm.SpecDecision
	// mic is the Module's ModuleImagesConfig (nil without a recipe or before the image controller
	// created it); gated the nodes whose entry waits for its image (gate.go).
	mic     *kmmv1beta1.ModuleImagesConfig
	gated   map[string]imageWait
	invalid string
	// refused quotes the API server's refusal of an object derived from the Module ("" when none).
	refused string
	// handoverPending says upstream KMM's device plugin DaemonSets of the Module still exist,
	// handoverMessage which nodes only they serve yet and why; handoverStuck is the message of a
	// handover waiting past its timeout ("" when not stuck; handover.go).
	handoverPending bool
	handoverMessage string
	handoverStuck   string
	// namespace is the Module's Namespace (nil if unread); namespaceTerminating the message of a
	// namespace being deleted ("" when it is not; namespace.go).
	namespace            *corev1.Namespace
	namespaceTerminating string
	// started is when the reconcile began to read: the time of its status write for
	// statusWriteWait, so that a reconcile an NMC change queued during the last one is not early.
	started time.Time
	// actedOn says the Module's generation was fully acted on (every write succeeded, or the Module
	// is invalid and its nodes are left alone): only then is it the status's observedGeneration.
	actedOn bool
}

// gather reads every node and NMC (the decision needs each node's labels and kernel).
func (r *Reconciler) gather(ctx context.Context, m *kmmv1beta1.Module) (*moduleScope, error) {
	s := &moduleScope{module: m, nmcs: map[string]*kmmv1beta1.NodeModulesConfig{}, decisions: map[string]fsm.SpecDecision{}}
	// Nodes and NMCs are only read: the cache's own objects, not a copy of every one per reconcile.
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	s.nodes = nodes.Items
	nmcs := &kmmv1beta1.NodeModulesConfigList{}
	if err := r.Client.List(ctx, nmcs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	for i := range nmcs.Items {
		s.nmcs[nmcs.Items[i].Name] = &nmcs.Items[i]
	}
	mic, err := r.readMIC(ctx, m)
	s.mic = mic
	return s, err
}

// decide checks the Module (a deleted one is unloaded whatever it says) and decides each node's
// spec entry: pure, from what gather read.
func (s *moduleScope) decide() {
	if errs := validation.Module(s.module); len(errs) > 0 && s.module.DeletionTimestamp.IsZero() {
		s.invalid = errs.ToAggregate().Error()
	}
	for i := range s.nodes {
		n := &s.nodes[i]
		s.decisions[n.Name] = fsm.DecideSpec(s.module, nodeView(n))
	}
	s.gated = gateImages(s.module, s.decisions, s.mic)
}

// nodeView is what the Module→NMC decision may see of a node: labels and kernel only.
func nodeView(n *corev1.Node) fsm.NodeView {
	return fsm.NodeView{Name: n.Name, Labels: n.Labels, KernelVersion: n.Status.NodeInfo.KernelVersion}
}

// SpecWriters is how many NMC entries the Module reconciles apply at once, together: every apply
// is a round trip, and one Module may have thousands of nodes.
const SpecWriters = 16

// Concurrency is how many Modules the controller reconciles at once. Modules created together
// (or changed together) sweep the nodes side by side, in the same order (node names) and sharing
// SpecWriters, so a node gets their entries at about the same time and the NMC controller starts
// its pairs in one reconcile (one NMC status write, the worker pods together; its coalescing
// window, controllers/node). One Module at a time put a Module's sweep between a node's entries:
// at 1,000 x 3, 9-16 s apart, and each node's pairs started (and ended) in 2-3 reconciles (issue
// 41, round four: docs/performance.md).
const Concurrency = 4

// syncSpecs applies the Module's entry on each node whose decision changes it, in the order of the
// node names.
func (r *Reconciler) syncSpecs(ctx context.Context, s *moduleScope, log logr.Logger) error {
	var applies []func() error
	for _, i := range byName(s.nodes) {
		if write := r.entryWrite(ctx, s, &s.nodes[i], log); write != nil {
			applies = append(applies, write)
		}
	}
	return shared.RunConcurrently(applies, r.writers())
}

// writers is the semaphore every Module reconcile's applies share (SpecWriters slots).
func (r *Reconciler) writers() chan struct{} {
	r.writersOnce.Do(func() { r.writerSlots = make(chan struct{}, SpecWriters) })
	return r.writerSlots
}

// byName lists the indexes of nodes in the order of their names.
func byName(nodes []corev1.Node) []int {
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(nodes[a].Name, nodes[b].Name) })
	return order
}

// entryWrite is the write of the Module's entry on node n its decision asks for (nil: none): by
// apply, or through syncTakenOver on an NMC that holds, or held, what upstream KMM left.
func (r *Reconciler) entryWrite(ctx context.Context, s *moduleScope, n *corev1.Node, log logr.Logger) func() error {
	d := s.decisions[n.Name]
	if _, ok := s.gated[n.Name]; ok {
		return nil // its image is not Present yet: the node keeps the entry it has (gate.go)
	}
	nmc := s.nmcs[n.Name]
	current := nmc.SpecEntry(s.module.Namespace, s.module.Name)
	changed := d.Action == fsm.SpecUpdate && (current == nil || !semantic.Equal(current, d.Entry))
	switch {
	case d.Action == fsm.SpecUpdate && needsTakeover(nmc, s.module):
		log.Info("Taking over an NMC spec entry upstream KMM wrote", "node", n.Name, "image", d.Entry.Config.ContainerImage)
		return func() error { return r.syncTakenOver(ctx, n.Name, n, s.module, d.Entry) }
	case d.Action == fsm.SpecDelete && current != nil && (needsTakeover(nmc, s.module) || takenOver(nmc)):
		log.Info("Removing NMC spec entry by patch (the NMC was taken over from upstream KMM)", "node", n.Name, "reason", d.Reason)
		return func() error { return r.syncTakenOver(ctx, n.Name, n, s.module, nil) }
	case changed && takenOver(nmc):
		// The takeover's field manager may still own fields of the entry: they are released
		// before the apply, so that a field the new entry drops goes (syncTakenOver).
		log.Info("Writing NMC spec entry (the NMC was taken over from upstream KMM)", "node", n.Name, "image", d.Entry.Config.ContainerImage)
		return func() error { return r.syncTakenOver(ctx, n.Name, n, s.module, d.Entry) }
	case changed:
		log.Info("Writing NMC spec entry", "node", n.Name, "image", d.Entry.Config.ContainerImage, "kernel", d.Entry.Config.KernelVersion)
		return func() error { return r.applyEntry(ctx, n, s.module, d.Entry) }
	case d.Action == fsm.SpecDelete && current != nil:
		log.Info("Removing NMC spec entry", "node", n.Name, "reason", d.Reason)
		return func() error { return r.applyEntry(ctx, n, s.module, nil) }
	}
	return nil
}

// applyEntry server-side-applies the Module's entry (nil: none) to the node's NMC with a field
// manager of its own: spec.modules is a list-map keyed by namespace and name, so entries of other
// Modules are never touched, and applying no entry removes only this Module's.
func (r *Reconciler) applyEntry(ctx context.Context, node *corev1.Node, m *kmmv1beta1.Module, e *kmmv1beta1.NodeModuleSpec) error {
	modules := []any{}
	if e != nil {
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := json.Unmarshal(data, &obj); err != nil {
			return err
		}
		modules = append(modules, obj)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(),
		"kind":       "NodeModulesConfig",
		"metadata": map[string]any{
			"name": node.Name,
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Node", "name": node.Name, "uid": string(node.UID),
			}},
		},
		"spec": map[string]any{"modules": modules},
	}}
	owner := client.FieldOwner(shared.FieldManager(m.Namespace, m.Name))
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), owner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the NMC entry of %s/%s on %s: %w", m.Namespace, m.Name, node.Name, err)
	}
	return nil
}

// releaseWhenUnloaded removes the finalizer of a deleted Module once no NMC has an entry for it,
// and upstream KMM's finalizer with it (after a takeover no one else would).
func (r *Reconciler) releaseWhenUnloaded(ctx context.Context, s *moduleScope, log logr.Logger) error {
	m := s.module
	if m.DeletionTimestamp.IsZero() ||
		(!controllerutil.ContainsFinalizer(m, Finalizer) && !controllerutil.ContainsFinalizer(m, UpstreamModuleFinalizer)) {
		return nil
	}
	for _, nmc := range s.nmcs {
		if nmc.SpecEntry(m.Namespace, m.Name) != nil || nmc.StatusEntry(m.Namespace, m.Name) != nil {
			return nil
		}
	}
	log.Info("Every node unloaded the module: releasing the Module")
	controllerutil.RemoveFinalizer(m, UpstreamModuleFinalizer)
	return client.IgnoreNotFound(r.patchFinalizers(ctx, m, controllerutil.RemoveFinalizer))
}

// patchFinalizers adds or removes kmm's finalizer with a patch of metadata.finalizers alone
// (guarded by the resourceVersion): an Update would send the whole object back as the Go types
// render it, dropping explicit defaults such as insecure: false and adding empty structs, which
// bumps the generation and shows as drift in GitOps tools.
func (r *Reconciler) patchFinalizers(ctx context.Context, m *kmmv1beta1.Module, change func(client.Object, string) bool) error {
	change(m, Finalizer)
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": m.ResourceVersion, "finalizers": m.Finalizers,
	}})
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, m, client.RawPatch(types.MergePatchType, data))
}
