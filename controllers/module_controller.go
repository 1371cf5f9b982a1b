package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=modules/finalizers,verbs=update
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=nodemodulesconfigs,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete

// ModuleFinalizer holds a Module until no node has it loaded.
const ModuleFinalizer = "kmm.sigs.x-k8s.io/unload"

// ModuleReconciler is the Module→NMC controller.
type ModuleReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
}

// SetupWithManager registers the controller: Modules, the Nodes their selectors match (label and
// kernel changes only: this controller never reads node status), NMCs and device plugin DaemonSets.
func (r *ModuleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("module").
		For(&kmmv1beta1.Module{}).
		Owns(&appsv1.DaemonSet{}).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.modulesForNode), builder.WithPredicates(nodeLabelsOrKernelChanged())).
		Watches(&kmmv1beta1.NodeModulesConfig{}, handler.EnqueueRequestsFromMapFunc(modulesInNMC)).
		Complete(r)
}

// nodeLabelsOrKernelChanged drops Node updates that change neither labels nor the kernel.
func nodeLabelsOrKernelChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !equality.Semantic.DeepEqual(o.Labels, n.Labels) || o.Status.NodeInfo.KernelVersion != n.Status.NodeInfo.KernelVersion
	}}
}

func (r *ModuleReconciler) modulesForNode(ctx context.Context, o client.Object) []ctrl.Request {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules); err != nil {
		return nil
	}
	var out []ctrl.Request
	for _, m := range modules.Items {
		if labels.SelectorFromSet(m.Spec.Selector).Matches(labels.Set(o.GetLabels())) || !m.DeletionTimestamp.IsZero() {
			out = append(out, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Name}})
		}
	}
	return out
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

// Reconcile writes the Module's NMC spec entries, its device plugin DaemonSet and its status.
func (r *ModuleReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("module", req.String())
	m := &kmmv1beta1.Module{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if m.DeletionTimestamp.IsZero() && controllerutil.AddFinalizer(m, ModuleFinalizer) {
		if err := r.Client.Update(ctx, m); err != nil {
			return ctrl.Result{}, err
		}
	}
	scope, err := r.gather(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	if errs := m.Validate(); len(errs) > 0 && m.DeletionTimestamp.IsZero() {
		log.Info("Invalid Module: leaving its nodes as they are", "error", errs.ToAggregate().Error())
		scope.invalid = errs.ToAggregate().Error()
		return ctrl.Result{}, r.writeStatus(ctx, scope)
	}
	errs := []error{r.syncSpecs(ctx, scope, log), r.syncDevicePlugin(ctx, scope)}
	errs = append(errs, r.writeStatus(ctx, scope))
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, r.releaseWhenUnloaded(ctx, scope, log)
}

// moduleScope is what one Module reconcile read and decided.
type moduleScope struct {
	module    *kmmv1beta1.Module
	nodes     []corev1.Node
	nmcs      map[string]*kmmv1beta1.NodeModulesConfig
	decisions map[string]fsm.SpecDecision
	invalid   string
}

func (r *ModuleReconciler) gather(ctx context.Context, m *kmmv1beta1.Module) (*moduleScope, error) {
	s := &moduleScope{module: m, nmcs: map[string]*kmmv1beta1.NodeModulesConfig{}, decisions: map[string]fsm.SpecDecision{}}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes); err != nil {
		return nil, err
	}
	s.nodes = nodes.Items
	nmcs := &kmmv1beta1.NodeModulesConfigList{}
	if err := r.Client.List(ctx, nmcs); err != nil {
		return nil, err
	}
	for i := range nmcs.Items {
		s.nmcs[nmcs.Items[i].Name] = &nmcs.Items[i]
	}
	for i := range s.nodes {
		n := &s.nodes[i]
		s.decisions[n.Name] = fsm.DecideSpec(m, nodeView(n))
	}
	return s, nil
}

// nodeView is what the Module→NMC decision may see of a node: labels and kernel only.
func nodeView(n *corev1.Node) fsm.NodeView {
	return fsm.NodeView{Name: n.Name, Labels: n.Labels, KernelVersion: n.Status.NodeInfo.KernelVersion}
}

// syncSpecs applies the Module's entry on each node whose decision changes it.
func (r *ModuleReconciler) syncSpecs(ctx context.Context, s *moduleScope, log logr.Logger) error {
	var errs []error
	for i := range s.nodes {
		n := &s.nodes[i]
		d := s.decisions[n.Name]
		current := specEntry(s.nmcs[n.Name], s.module.Namespace, s.module.Name)
		switch {
		case d.Action == fsm.SpecUpdate && (current == nil || !equality.Semantic.DeepEqual(*current, *d.Entry)):
			log.Info("Writing NMC spec entry", "node", n.Name, "image", d.Entry.Config.ContainerImage, "kernel", d.Entry.Config.KernelVersion)
			errs = append(errs, r.applyEntry(ctx, n, s.module, d.Entry))
		case d.Action == fsm.SpecDelete && current != nil:
			log.Info("Removing NMC spec entry", "node", n.Name, "reason", d.Reason)
			errs = append(errs, r.applyEntry(ctx, n, s.module, nil))
		}
	}
	return errors.Join(errs...)
}

func specEntry(nmc *kmmv1beta1.NodeModulesConfig, ns, name string) *kmmv1beta1.NodeModuleSpec {
	if nmc == nil {
		return nil
	}
	for i := range nmc.Spec.Modules {
		if e := &nmc.Spec.Modules[i]; e.Namespace == ns && e.Name == name {
			return e
		}
	}
	return nil
}

// applyEntry server-side-applies the Module's entry (nil: none) to the node's NMC with a field
// manager of its own: spec.modules is a list-map keyed by namespace and name, so entries of other
// Modules are never touched, and applying no entry removes only this Module's.
func (r *ModuleReconciler) applyEntry(ctx context.Context, node *corev1.Node, m *kmmv1beta1.Module, e *kmmv1beta1.NodeModuleSpec) error {
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
	owner := client.FieldOwner(fmt.Sprintf("kmm-module/%s/%s", m.Namespace, m.Name))
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), owner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the NMC entry of %s/%s on %s: %w", m.Namespace, m.Name, node.Name, err)
	}
	return nil
}

// releaseWhenUnloaded removes the finalizer of a deleted Module once no NMC has an entry for it.
func (r *ModuleReconciler) releaseWhenUnloaded(ctx context.Context, s *moduleScope, log logr.Logger) error {
	m := s.module
	if m.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(m, ModuleFinalizer) {
		return nil
	}
	for _, nmc := range s.nmcs {
		if specEntry(nmc, m.Namespace, m.Name) != nil || statusEntry(nmc, m.Namespace, m.Name) != nil {
			return nil
		}
	}
	log.Info("Every node unloaded the module: releasing the Module")
	controllerutil.RemoveFinalizer(m, ModuleFinalizer)
	return client.IgnoreNotFound(r.Client.Update(ctx, m))
}

func statusEntry(nmc *kmmv1beta1.NodeModulesConfig, ns, name string) *kmmv1beta1.NodeModuleStatus {
	for i := range nmc.Status.Modules {
		if st := &nmc.Status.Modules[i]; st.Namespace == ns && st.Name == name {
			return st
		}
	}
	return nil
}
