package module

import (
	"context"
	"encoding/json"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/retry"
	"github.com/kmm-project/kmm/internal/validation"
)

// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules/finalizers,verbs=update
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=nodemodulesconfigs,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
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
		Watches(&corev1.Node{}, r.nodeEvents(), builder.WithPredicates(nodeLabelsOrKernelChanged())).
		Watches(&kmmv1beta1.NodeModulesConfig{}, nmcEvents()).
		WithOptions(controller.Options{RateLimiter: retry.Limiter()}).
		Complete(r)
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
	errs := []error{r.syncSpecs(ctx, s, log), r.syncDevicePlugin(ctx, s)}
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
	invalid   string
	// refused quotes the API server's refusal of an object derived from the Module ("" when none).
	refused string
	// handoverPending says upstream KMM's device plugin DaemonSets of the Module still exist,
	// handoverMessage which nodes only they serve yet and why; handoverStuck is the message of a
	// handover waiting past its timeout ("" when not stuck; handover.go).
	handoverPending bool
	handoverMessage string
	handoverStuck   string
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
	return s, nil
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
}

// nodeView is what the Module→NMC decision may see of a node: labels and kernel only.
func nodeView(n *corev1.Node) fsm.NodeView {
	return fsm.NodeView{Name: n.Name, Labels: n.Labels, KernelVersion: n.Status.NodeInfo.KernelVersion}
}

// releaseWhenUnloaded removes the finalizer of a deleted Module once no NMC has an entry for it,
// and upstream KMM's finalizer with it (after a switch from upstream no one else would).
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
