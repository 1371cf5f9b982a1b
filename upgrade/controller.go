package upgrade

import (
	"context"
	"encoding/json"
	"maps"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/podindex"
	"github.com/kmm-project/kmm/internal/retry"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch

// LabelReconciler is the version label controller of seed 002: per node, for every Module with a
// version, it moves the internal version labels one step toward the user's version-module label.
type LabelReconciler struct {
	Client client.Client
}

// SetupWithManager watches Nodes (labels), NMCs (pair states), device plugin pods and Modules.
func (r *LabelReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := podindex.Register(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	byName := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []ctrl.Request {
		return r.ifConcerned(ctx, o.GetName())
	})
	byPodNode := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []ctrl.Request {
		p := o.(*corev1.Pod)
		if (!nodePluginPod(p.Labels) && !selectsLegacy(p.Spec.NodeSelector)) || p.Spec.NodeName == "" {
			return nil
		}
		return r.ifConcerned(ctx, p.Spec.NodeName)
	})
	// A DaemonSet that stops selecting on a legacy label lets the nodes that carry it drop it.
	byLegacySelector := handler.EnqueueRequestsFromMapFunc(r.nodesWithLegacyLabels)
	concerned := predicate.NewPredicateFuncs(func(o client.Object) bool { return r.concerns(context.Background(), o.GetLabels()) })
	return ctrl.NewControllerManagedBy(mgr).
		Named("version-labels").
		For(&corev1.Node{}, builder.WithPredicates(labelsChanged(), concerned)).
		Watches(&kmmv1beta1.NodeModulesConfig{}, byName).
		Watches(&corev1.Pod{}, byPodNode).
		Watches(&appsv1.DaemonSet{}, byLegacySelector).
		// Only spec changes of a Module matter here: its status changes often during a rollout and
		// would enqueue every node it selects each time.
		Watches(&kmmv1beta1.Module{}, handler.EnqueueRequestsFromMapFunc(r.nodesOfModule),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{RateLimiter: retry.Limiter()}).
		Complete(r)
}

func labelsChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
	}}
}

// concerns says whether a node with these labels has anything for this controller to do: some
// Module has a version (its labels may need a step), or the node carries internal version labels
// (they may be stale). Without either a reconcile patches nothing, so the events of a cluster
// without versioned Modules (every NMC and ready-label write of a load) enqueue nothing.
func (r *LabelReconciler) concerns(ctx context.Context, nodeLabels map[string]string) bool {
	return hasInternalVersionLabel(nodeLabels) || r.anyVersionedModule(ctx)
}

// hasInternalVersionLabel says whether a node carries an internal version label of any Module.
func hasInternalVersionLabel(nodeLabels map[string]string) bool {
	for key := range nodeLabels {
		if _, ok := kmmv1beta1.ParseInternalVersionLabel(key); ok {
			return true
		}
	}
	return false
}

// anyVersionedModule says whether some Module has a version (true when the cache cannot say).
func (r *LabelReconciler) anyVersionedModule(ctx context.Context) bool {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules, client.UnsafeDisableDeepCopy); err != nil {
		return true
	}
	for i := range modules.Items {
		if modules.Items[i].Spec.Version() != "" {
			return true
		}
	}
	return false
}

// ifConcerned is the request for the node when concerns says it has something to do.
func (r *LabelReconciler) ifConcerned(ctx context.Context, nodeName string) []ctrl.Request {
	n := &corev1.Node{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: nodeName}, n, client.UnsafeDisableDeepCopy); err == nil && !r.concerns(ctx, n.Labels) {
		return nil
	}
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Name: nodeName}}}
}

// nodesOfModule maps a Module to the nodes it selects that concerns passes: every selected node for
// a Module with a version, only those with internal version labels (which may now be stale) for one
// without.
func (r *LabelReconciler) nodesOfModule(ctx context.Context, o client.Object) []ctrl.Request {
	m := o.(*kmmv1beta1.Module)
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.MatchingLabels(m.Spec.Selector), client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	versioned := m.Spec.Version() != "" || r.anyVersionedModule(ctx)
	out := make([]ctrl.Request, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		if versioned || hasInternalVersionLabel(n.Labels) {
			out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
		}
	}
	return out
}

// Reconcile moves the version labels of one node by one step per Module.
func (r *LabelReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := r.Client.Get(ctx, req.NamespacedName, nmc); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	// Only this node's pods, through the pod-by-node index of the manager's cache
	// (contract.PodNodeNameField), without copies: kmm's device plugin and DRA driver pods, and any pod that selects
	// on a legacy version label.
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.MatchingFields{contract.PodNodeNameField: node.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	daemonSets := &appsv1.DaemonSetList{}
	if hasLegacyLabel(node.Labels) {
		if err := r.Client.List(ctx, daemonSets, client.UnsafeDisableDeepCopy); err != nil {
			return ctrl.Result{}, err
		}
	}
	patch := map[string]any{}
	active := map[string]bool{}
	for i := range modules.Items {
		m := &modules.Items[i]
		if m.Spec.Version() == "" || !m.DeletionTimestamp.IsZero() ||
			!labels.SelectorFromSet(m.Spec.Selector).Matches(labels.Set(node.Labels)) {
			continue
		}
		active[m.Namespace+"/"+m.Name] = true
		stepModule(node, m, observe(nmc, pods.Items, node.Name, m), legacySelected(m, daemonSets.Items, pods.Items), patch)
	}
	for _, key := range StaleInternalLabels(node.Labels, active, pairsOf(nmc)) {
		patch[key] = nil
	}
	if len(patch) == 0 {
		return ctrl.Result{}, nil
	}
	ctrl.LoggerFrom(ctx).Info("Moving version labels", "node", node.Name, "labels", patch)
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": patch}})
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.Client.Patch(ctx, node, client.RawPatch(types.MergePatchType, data))
}

// stepModule adds to patch the label changes of one step for Module m on node; legacyNeeded says a
// DaemonSet or a pod on the node still selects on the legacy version-device-plugin label.
func stepModule(node *corev1.Node, m *kmmv1beta1.Module, o Observed, legacyNeeded bool, patch map[string]any) {
	keys := struct{ target, workerPod, devicePlugin string }{
		kmmv1beta1.ModuleVersionLabel(m.Namespace, m.Name), kmmv1beta1.WorkerPodVersionLabel(m.Namespace, m.Name), kmmv1beta1.DevicePluginVersionLabel(m.Namespace, m.Name),
	}
	in := NodeLabels{Target: node.Labels[keys.target], WorkerPod: node.Labels[keys.workerPod], DevicePlugin: node.Labels[keys.devicePlugin]}
	out := NextLabels(in, o)
	setPatch(patch, keys.workerPod, in.WorkerPod, out.WorkerPod)
	legacyKey, ok := kmmv1beta1.LegacyDevicePluginVersionLabel(m.Namespace, m.Name)
	if !ok {
		setPatch(patch, keys.devicePlugin, in.DevicePlugin, out.DevicePlugin)
		return
	}
	current, legacy := SwitchedLabels(in, node.Labels[legacyKey], o, legacyNeeded)
	setPatch(patch, keys.devicePlugin, in.DevicePlugin, current)
	setPatch(patch, legacyKey, node.Labels[legacyKey], legacy)
}

// selectsLegacy says whether a node selector names a legacy version-device-plugin label.
func selectsLegacy(nodeSelector map[string]string) bool {
	return hasLegacyLabel(nodeSelector)
}

// nodesWithLegacyLabels maps a DaemonSet to the nodes carrying a legacy version-device-plugin label
// its pod template selects on.
func (r *LabelReconciler) nodesWithLegacyLabels(ctx context.Context, o client.Object) []ctrl.Request {
	ds := o.(*appsv1.DaemonSet)
	var out []ctrl.Request
	for key := range ds.Spec.Template.Spec.NodeSelector {
		if !strings.HasPrefix(key, kmmv1beta1.LegacyDevicePluginVersionPrefix) {
			continue
		}
		nodes := &corev1.NodeList{}
		if err := r.Client.List(ctx, nodes, client.HasLabels{key}, client.UnsafeDisableDeepCopy); err != nil {
			continue
		}
		for _, n := range nodes.Items {
			out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
		}
	}
	return out
}

// hasLegacyLabel says whether a node carries a legacy version-device-plugin label of any Module.
func hasLegacyLabel(nodeLabels map[string]string) bool {
	for key := range nodeLabels {
		if strings.HasPrefix(key, kmmv1beta1.LegacyDevicePluginVersionPrefix) {
			return true
		}
	}
	return false
}

// legacySelected says whether a DaemonSet in m's namespace (kmm's, or upstream KMM's left from a
// takeover) or a pod on the node selects on m's legacy version-device-plugin label.
func legacySelected(m *kmmv1beta1.Module, daemonSets []appsv1.DaemonSet, pods []corev1.Pod) bool {
	key, ok := kmmv1beta1.LegacyDevicePluginVersionLabel(m.Namespace, m.Name)
	if !ok {
		return false
	}
	for i := range daemonSets {
		if _, on := daemonSets[i].Spec.Template.Spec.NodeSelector[key]; on && daemonSets[i].Namespace == m.Namespace {
			return true
		}
	}
	for i := range pods {
		if _, on := pods[i].Spec.NodeSelector[key]; on && pods[i].DeletionTimestamp == nil {
			return true
		}
	}
	return false
}

func setPatch(patch map[string]any, key, before, after string) {
	switch {
	case before == after:
	case after == "":
		patch[key] = nil
	default:
		patch[key] = after
	}
}

// nodePluginPod says whether a kmm pod is a device plugin or DRA driver pod.
func nodePluginPod(labels map[string]string) bool {
	return labels[contract.LabelDevicePlugin] != "" || labels[contract.LabelDRA] != ""
}

// observe reads the pair's loaded version and state, and whether its device plugin (or DRA driver)
// pod is on the node.
func observe(nmc *kmmv1beta1.NodeModulesConfig, pods []corev1.Pod, node string, m *kmmv1beta1.Module) Observed {
	var o Observed
	if st := nmc.StatusEntry(m.Namespace, m.Name); st != nil && st.Config != nil {
		o.LoadedVersion, o.Loaded = st.Config.Version, st.State == kmmv1beta1.StateLoaded
	}
	o.DRA = m.Spec.DRA != nil
	for _, p := range pods {
		if p.Spec.NodeName == node && nodePluginPod(p.Labels) &&
			p.Labels[contract.LabelModuleNamespace] == m.Namespace && p.Labels[contract.LabelModuleName] == m.Name {
			o.DevicePluginPodOnNode = true
		}
	}
	return o
}

// StaleInternalLabels returns the internal version labels of a node that no longer serve anything:
// their Module is gone, being deleted, unversioned or no longer selects the node (not in active),
// and the node has no pair of it left (not in pairs, the NMC's status entries). Module keys are
// "<namespace>/<name>".
func StaleInternalLabels(nodeLabels map[string]string, active, pairs map[string]bool) []string {
	var out []string
	for key := range nodeLabels {
		if module, ok := kmmv1beta1.ParseInternalVersionLabel(key); ok && !active[module] && !pairs[module] {
			out = append(out, key)
		}
	}
	sort.Strings(out)
	return out
}

// pairsOf lists the modules with a status entry in nmc.
func pairsOf(nmc *kmmv1beta1.NodeModulesConfig) map[string]bool {
	out := make(map[string]bool, len(nmc.Status.Modules))
	for _, st := range nmc.Status.Modules {
		out[st.Namespace+"/"+st.Name] = true
	}
	return out
}
