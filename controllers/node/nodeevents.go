package node

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// nodeEvents lets through the Node events that may change a decision: creations, deletions,
// resyncs, and updates that change what the NMC controller reads of a Node (nodeReadChanged). A
// real kubelet posts its Node's status with new heartbeat times, and its images and resources
// change; none of that is read, and at 1,000 real-looking nodes posting every 60 s it was an NMC
// reconcile per post (issue 41, item 3: docs/performance.md, "A cluster that is not empty").
func nodeEvents() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, okOld := e.ObjectOld.(*corev1.Node)
		n, okNew := e.ObjectNew.(*corev1.Node)
		if !okOld || !okNew || o.ResourceVersion == n.ResourceVersion {
			return true
		}
		return nodeReadChanged(o, n)
	}}
}

// nodeReadChanged says whether a Node changed in what the NMC controller reads of it: its labels
// (the Modules' ready and version labels, the DRA claims' node selectors), observeNode's facts
// (schedulability, kernel, boot ID, the Ready condition and its time), its deletion.
func nodeReadChanged(o, n *corev1.Node) bool {
	a, b := observeNode(o), observeNode(n)
	return !maps.Equal(o.Labels, n.Labels) || a.Ready != b.Ready || !a.ReadySince.Equal(b.ReadySince) ||
		a.Schedulable != b.Schedulable || a.KernelVersion != b.KernelVersion || a.BootID != b.BootID ||
		o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
}
