package agent

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fullPassInterval is how often the loop looks at every pod and Node, a safety net under the passes
// that look at what changed only.
const fullPassInterval = time.Second

// nodeNameField indexes the cached pods by the node they are bound to.
const nodeNameField = "spec.nodeName"

// podNodeName is the value of nodeNameField for a cached pod.
func podNodeName(obj client.Object) []string { return []string{obj.(*corev1.Pod).Spec.NodeName} }

// pass is one turn of the loop. It looks at the pods and Nodes that changed since the last pass
// and, on a tick, at the waiting pods. The first pass, a pass asked for by SetHold or SetOutcome,
// and one every fullPassInterval look at everything instead.
//
// The passes read the cached objects without copying them: they never change them, and every write
// re-reads the object first. Errors are logged and retried by a later pass: every step is
// idempotent.
func (a *Agent) pass(ctx context.Context, c cache.Cache, tick bool) {
	p := a.changes.take()
	if !p.full && a.clock.Since(a.lastFull) < fullPassInterval {
		a.syncChanged(ctx, c, p, tick)
		return
	}
	if err := a.syncAll(ctx, c); err != nil {
		a.log.Error(err, "Looking at every pod and node")
		a.changes.requestFull()
		return
	}
	a.lastFull = a.clock.Now()
}

// syncAll looks at every cached pod and Node.
func (a *Agent) syncAll(ctx context.Context, c cache.Cache) error {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	all := make([]*corev1.Pod, len(pods.Items))
	present := make(map[types.UID]bool, len(pods.Items))
	for i := range pods.Items {
		all[i] = &pods.Items[i]
		present[all[i].UID] = true
	}
	a.waiting = a.syncPods(ctx, all)
	a.forgetPods(present)

	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		a.syncNodeLogged(ctx, &nodes.Items[i])
	}
	return nil
}

// syncChanged looks at the pods and Nodes in p, at the pods of the nodes it woke, and, on a tick,
// at the waiting pods.
func (a *Agent) syncChanged(ctx context.Context, c cache.Cache, p pending, tick bool) {
	keys := p.pods
	if keys == nil {
		keys = podSet{}
	}
	if tick {
		maps.Copy(keys, a.waiting)
	}
	a.addPodsOn(ctx, c, p.woken, keys)
	for key := range keys {
		delete(a.waiting, key) // back below if it still waits
	}
	maps.Copy(a.waiting, a.syncPods(ctx, a.cachedPods(ctx, c, keys)))
	a.forget(p.gone)
	a.syncNodes(ctx, c, p.nodes)
}

// addPodsOn adds to keys the cached pods bound to nodes.
func (a *Agent) addPodsOn(ctx context.Context, c cache.Cache, nodes map[string]struct{}, keys podSet) {
	for node := range nodes {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.MatchingFields{nodeNameField: node}, client.UnsafeDisableDeepCopy); err != nil {
			a.log.Error(err, "Listing the pods of a node", "node", node)
			a.changes.wake(node)
			continue
		}
		for i := range pods.Items {
			keys.add(&pods.Items[i])
		}
	}
}

// cachedPods reads the pods of keys from the cache. A pod that is gone is left out; one that cannot
// be read waits.
func (a *Agent) cachedPods(ctx context.Context, c cache.Cache, keys podSet) []*corev1.Pod {
	pods := make([]*corev1.Pod, 0, len(keys))
	for key := range keys {
		pod := &corev1.Pod{}
		err := c.Get(ctx, key, pod, client.UnsafeDisableDeepCopy)
		switch {
		case err == nil:
			pods = append(pods, pod)
		case !apierrors.IsNotFound(err):
			a.log.Error(err, "Reading a pod", "namespace", key.Namespace, "pod", key.Name)
			a.waiting[key] = struct{}{}
		}
	}
	return pods
}

// syncPods moves pods along and returns those that need another look as time passes.
func (a *Agent) syncPods(ctx context.Context, pods []*corev1.Pod) podSet {
	again := podSet{}
	var parallel []*corev1.Pod
	for _, pod := range pods {
		switch {
		case isValidationPod(pod):
			if a.syncOne(ctx, pod, a.syncValidationPod) {
				again.add(pod)
			}
		case !isWorkerPod(pod):
			if a.syncOne(ctx, pod, a.syncOtherPod) {
				again.add(pod)
			}
		case a.opts.Workers > 1:
			parallel = append(parallel, pod)
		case a.syncOne(ctx, pod, a.syncPod):
			again.add(pod)
		}
	}
	for _, pod := range a.syncPodsParallel(ctx, parallel) {
		again.add(pod)
	}
	return again
}

// syncOne moves pod along with sync and says whether it needs another look as time passes: sync
// failed, or pod waits (held or delayed). A pod left alone because its node is NotReady or not
// managed does not: the node wakes it (changes.wake).
func (a *Agent) syncOne(ctx context.Context, pod *corev1.Pod, sync func(context.Context, *corev1.Pod) error) bool {
	err := sync(ctx, pod)
	if err != nil && ctx.Err() == nil {
		a.log.Error(err, "Running a worker pod", "namespace", pod.Namespace, "pod", pod.Name, "node", pod.Spec.NodeName)
	}
	return err != nil || a.waits(pod)
}

// syncNodes compares the cached Nodes called names with what the agent says.
func (a *Agent) syncNodes(ctx context.Context, c cache.Cache, names map[string]struct{}) {
	for name := range names {
		var node corev1.Node
		err := c.Get(ctx, client.ObjectKey{Name: name}, &node, client.UnsafeDisableDeepCopy)
		switch {
		case err == nil:
			a.syncNodeLogged(ctx, &node)
		case !apierrors.IsNotFound(err):
			a.log.Error(err, "Reading a node", "node", name)
			a.changes.nodeChanged(name)
		}
	}
}

// syncNodeLogged is syncNode, logging its error; writeNodeStatus has the next pass retry it.
func (a *Agent) syncNodeLogged(ctx context.Context, node *corev1.Node) {
	if err := a.syncNode(ctx, node); err != nil && ctx.Err() == nil {
		a.log.Error(err, "Re-asserting a node's status", "node", node.Name)
	}
}

// forgetPods drops the bookkeeping of pods that no longer exist.
func (a *Agent) forgetPods(present map[types.UID]bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid := range a.seen {
		if !present[uid] {
			delete(a.seen, uid)
		}
	}
	for _, m := range []map[types.UID]bool{a.finished, a.deleted} {
		for uid := range m {
			if !present[uid] {
				delete(m, uid)
			}
		}
	}
}

// forget drops the bookkeeping of the deleted pods gone.
func (a *Agent) forget(gone []types.UID) {
	if len(gone) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, uid := range gone {
		delete(a.seen, uid)
		delete(a.finished, uid)
		delete(a.deleted, uid)
	}
}
