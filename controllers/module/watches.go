package module

import (
	"context"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/semantic"
)

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
		return !semantic.Equal(&o.Labels, &n.Labels) || o.Status.NodeInfo.KernelVersion != n.Status.NodeInfo.KernelVersion
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
// version-worker-pod label, the device plugin DaemonSets the version-device-plugin label
// (fsm.KeepOldDevicePlugin), the Module's status only the decisions and the NMC statuses (whose
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
