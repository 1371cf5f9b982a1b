package node

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/kmm-project/kmm/contract"
)

// DefaultCoalesceWindow is how long the NMC controller waits before it reconciles a node whose NMC
// was just created or had its spec changed, or one of whose worker pods changed (a worker pod
// ending is such a change): the changes that follow within the window (the other Modules' spec
// entries, the node's other worker pods ending) fold into the same reconcile, one NMC status write
// and one node label patch. Any other event of the node (its NMC's status, its labels, a pod
// created or gone) is not delayed, nor is the end of the node's last running worker pod (nothing
// left to fold: mayFold), nor a node already waiting in the queue: a node waits at most this
// long. Issue 41, rounds four and five (docs/performance.md).
const DefaultCoalesceWindow = time.Second

// queue is the NMC controller's work queue as an event handler sees it.
type queue = workqueue.TypedRateLimitingInterface[ctrl.Request]

// enqueueNode adds node to q, after the coalescing window when delay is set.
func (r *NMCReconciler) enqueueNode(q queue, node string, delay bool) {
	if node == "" {
		return
	}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Name: node}}
	if delay && r.CoalesceWindow > 0 {
		q.AddAfter(req, r.CoalesceWindow)
		return
	}
	q.Add(req)
}

// nmcEvents enqueues the node of an NMC event: at once, but for a new NMC and a spec change (the
// generation moves), which wait the coalescing window. A create of the cache's initial list (the
// operator starting) is not delayed.
func (r *NMCReconciler) nmcEvents() handler.Funcs {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q queue) {
			r.enqueueNode(q, e.Object.GetName(), !e.IsInInitialList)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q queue) {
			r.enqueueNode(q, e.ObjectNew.GetName(), e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration())
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q queue) {
			r.enqueueNode(q, e.Object.GetName(), false)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q queue) {
			r.enqueueNode(q, e.Object.GetName(), false)
		},
	}
}

// podEvents enqueues the node of a kmm pod event and tells the pod expectations what the cache
// shows: at once, but for an update of a worker pod (its end, or a step before it: the decision
// acts only on its end), which waits the coalescing window.
func (r *NMCReconciler) podEvents() handler.Funcs {
	observe := func(o any) *corev1.Pod {
		p, _ := o.(*corev1.Pod)
		if p != nil {
			r.expected().observed(p)
		}
		return p
	}
	enqueue := func(q queue, o any) {
		if p := observe(o); p != nil {
			r.enqueueNode(q, p.Spec.NodeName, false)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q queue) { enqueue(q, e.Object) },
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q queue) {
			old, p := observe(e.ObjectOld), observe(e.ObjectNew)
			if old == nil || p == nil {
				return
			}
			if old.Spec.NodeName != p.Spec.NodeName {
				r.enqueueNode(q, old.Spec.NodeName, false)
			}
			r.enqueueNode(q, p.Spec.NodeName, isWorkerPod(p) && r.mayFold(p))
		},
		DeleteFunc:  func(_ context.Context, e event.DeleteEvent, q queue) { enqueue(q, e.Object) },
		GenericFunc: func(_ context.Context, e event.GenericEvent, q queue) { enqueue(q, e.Object) },
	}
}

// mayFold says whether another pair's change may follow worker pod p's update within the window:
// p has not ended (only its end matters to a decision), or another worker pod of its node has not
// ended yet. The end of a node's last running worker pod (a node with one Module, or the last of
// its pods) has nothing to wait for and is reconciled at once. A failed read of the cache says yes:
// the node then waits the window, as before.
func (r *NMCReconciler) mayFold(p *corev1.Pod) bool {
	if !podEnded(p) {
		return true
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(context.Background(), pods, client.MatchingLabels{contract.LabelWorker: "true"},
		client.MatchingFields{contract.PodNodeNameField: p.Spec.NodeName}, client.UnsafeDisableDeepCopy); err != nil {
		return true
	}
	for i := range pods.Items {
		if o := &pods.Items[i]; o.UID != p.UID && o.DeletionTimestamp.IsZero() && !podEnded(o) {
			return true
		}
	}
	return false
}

// podEnded says whether p's containers have ended (Succeeded or Failed).
func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// isWorkerPod says whether p is a worker pod (not a device plugin or DRA driver pod).
func isWorkerPod(p *corev1.Pod) bool {
	return p.Labels[contract.LabelWorker] == "true"
}
