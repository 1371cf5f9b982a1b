package module

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;patch

// The namespace guard (docs/api.md#namespaces-holding-modules): a Module's worker pods run in its
// namespace, so a namespace being deleted can no longer unload its Modules. The Module controller
// labels every namespace that holds a Module with kmmv1beta1.NamespaceLabel (and removes the label
// once it holds none); the validating webhook refuses to delete a labelled namespace that still holds
// Modules. A deletion that got past it (webhook down or off) turns the Module Degraded with reason
// NamespaceTerminating and one Event on the Namespace (an Event in the terminating namespace itself
// would be refused).

// syncNamespace reads the Module's namespace into the scope and labels it as holding Modules.
func (r *Reconciler) syncNamespace(ctx context.Context, s *moduleScope) error {
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: s.module.Namespace}, ns); err != nil {
		return client.IgnoreNotFound(err)
	}
	s.namespace = ns
	if !ns.DeletionTimestamp.IsZero() {
		s.namespaceTerminating = namespaceTerminatingMessage(s)
		return nil
	}
	if _, ok := ns.Labels[kmmv1beta1.NamespaceLabel]; ok {
		return nil
	}
	return r.Client.Patch(ctx, ns, client.RawPatch(types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, kmmv1beta1.NamespaceLabel)))
}

// namespaceTerminatingMessage says why nothing more happens for the Module, naming the nodes that
// still have it.
func namespaceTerminatingMessage(s *moduleScope) string {
	var nodes []string
	for name, nmc := range s.nmcs {
		if nmc.StatusEntry(s.module.Namespace, s.module.Name) != nil {
			nodes = append(nodes, name)
		}
	}
	msg := fmt.Sprintf("namespace %s is being deleted: no worker pod can be created in it, so the module is neither unloaded nor loaded any more", s.module.Namespace)
	if len(nodes) > 0 {
		msg += "; still loaded or recorded on " + joinSorted(nodes)
	}
	return msg + " (docs/troubleshooting.md: a Module's namespace is being deleted)"
}

// unlabelNamespace removes the namespace label once the namespace holds no Module.
func (r *Reconciler) unlabelNamespace(ctx context.Context, namespace string) error {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules, client.InNamespace(namespace), client.Limit(1)); err != nil || len(modules.Items) > 0 {
		return err
	}
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: namespace}, ns); err != nil {
		return client.IgnoreNotFound(err)
	}
	if _, ok := ns.Labels[kmmv1beta1.NamespaceLabel]; !ok {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Patch(ctx, ns, client.RawPatch(types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, kmmv1beta1.NamespaceLabel))))
}

// namespaceDeletedOrRelabelled passes Namespace updates that start its deletion or change its labels.
func namespaceDeletedOrRelabelled() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !e.ObjectOld.GetDeletionTimestamp().Equal(e.ObjectNew.GetDeletionTimestamp()) ||
				!maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels())
		},
	}
}

// modulesOfNamespace enqueues the Modules of a Namespace whose deletion started or whose label changed.
func (r *Reconciler) modulesOfNamespace() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []ctrl.Request {
		modules := &kmmv1beta1.ModuleList{}
		if err := r.Client.List(ctx, modules, client.InNamespace(o.GetName()), client.UnsafeDisableDeepCopy); err != nil {
			return nil
		}
		out := make([]ctrl.Request, 0, len(modules.Items))
		for i := range modules.Items {
			out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&modules.Items[i])})
		}
		return out
	})
}
