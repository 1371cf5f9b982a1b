package agent

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

// podSet is a set of pods by namespace and name.
type podSet map[types.NamespacedName]struct{}

// add puts pod's key into s.
func (s podSet) add(pod *corev1.Pod) { s[podKey(pod)] = struct{}{} }

// podKey is the namespace and name of pod.
func podKey(pod *corev1.Pod) types.NamespacedName {
	return types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
}

// pending is what the next pass of the loop must look at besides the waiting pods.
type pending struct {
	// full asks for a look at every pod and Node (syncAll).
	full bool
	// pods changed: added, updated or deleted.
	pods podSet
	// gone are the UIDs of deleted pods, whose bookkeeping the pass drops.
	gone []types.UID
	// nodes are the Nodes whose status to compare with what the agent says.
	nodes map[string]struct{}
	// woken are managed nodes whose state the agent changed (added, Ready again, rebooted): their
	// pods and Node status need a look.
	woken map[string]struct{}
}

// changes collects what the informers' event handlers and the agent's own calls report between two
// passes. It has its own lock so that the handlers never wait for a.mu, which API calls hold.
type changes struct {
	mu sync.Mutex
	p  pending
}

// take returns what was reported since the last take and starts afresh.
func (c *changes) take() pending {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.p
	c.p = pending{}
	return p
}

// requestFull asks the next pass to look at everything.
func (c *changes) requestFull() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.p.full = true
}

// podChanged reports a pod that was added or updated, or, when gone, deleted.
func (c *changes) podChanged(pod *corev1.Pod, gone bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p.pods == nil {
		c.p.pods = podSet{}
	}
	c.p.pods.add(pod)
	if gone {
		c.p.gone = append(c.p.gone, pod.UID)
	}
}

// nodeChanged reports a Node whose status may differ from what the agent says.
func (c *changes) nodeChanged(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.p.nodes = addName(c.p.nodes, name)
}

// wake reports a managed node whose state the agent changed.
func (c *changes) wake(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.p.woken = addName(c.p.woken, name)
}

// addName adds name to set, creating it when nil.
func addName(set map[string]struct{}, name string) map[string]struct{} {
	if set == nil {
		set = map[string]struct{}{}
	}
	set[name] = struct{}{}
	return set
}

// podHandler reports the pod events to a.changes and wakes the loop.
func (a *Agent) podHandler() toolscache.ResourceEventHandler {
	changed := func(obj any, gone bool) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			a.changes.podChanged(pod, gone)
		} else {
			a.changes.requestFull()
		}
		a.poke()
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { changed(obj, false) },
		UpdateFunc: func(_, obj any) { changed(obj, false) },
		DeleteFunc: func(obj any) { changed(obj, true) },
	}
}

// nodeHandler reports added and updated Nodes to a.changes and wakes the loop. A deleted Node needs
// nothing: the agent does not recreate Nodes.
func (a *Agent) nodeHandler() toolscache.ResourceEventHandler {
	changed := func(obj any) {
		if node, ok := obj.(*corev1.Node); ok {
			a.changes.nodeChanged(node.Name)
			a.poke()
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
	}
}
