package seededbug

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
)

// memory is what the wrappers of one process remember.
type memory struct {
	cordoned sync.Map // node name → true: cordoned by this process (ForgetCordon)
	disowned sync.Map // node name → true: uncordon left to "whoever changed the node" (ConflictDisownsCordon)
	awaited  sync.Map // pod UID → pair: deleted, delete event not seen yet (TombstoneIgnored)
	lost     sync.Map // pod UID → true: DELETE without an answer, taken as done (LostAnswerAsDeleted)
}

// watchDeletions adds the bugs' handler of pod delete events to the manager's pod informer: a
// delete event meets the deletions awaited and forgets a pod taken as deleted; a tombstone
// (toolscache.DeletedFinalStateUnknown) only the latter (TombstoneIgnored).
func (m *memory) watchDeletions(c cache.Cache) error {
	inf, err := c.GetInformer(context.Background(), &corev1.Pod{})
	if err != nil {
		return err
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			m.awaited.Delete(p.UID)
			m.lost.Delete(p.UID)
		}
		if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			if p, ok := t.Obj.(*corev1.Pod); ok {
				m.lost.Delete(p.UID)
			}
		}
	}})
	return err
}

// awaiting says whether a deletion of a worker pod of pair is awaited.
func (m *memory) awaiting(pair string) bool {
	waiting := false
	m.awaited.Range(func(_, v any) bool {
		waiting = waiting || v == pair
		return !waiting
	})
	return waiting
}

// seededClient is the manager's client with the planted bugs' mistakes.
type seededClient struct {
	client.Client
	bugs Set
	m    *memory
}

// workerPod is obj as a kmm worker pod.
func workerPod(obj client.Object) (*corev1.Pod, bool) {
	p, ok := obj.(*corev1.Pod)
	return p, ok && p.Labels[contract.LabelWorker] == "true"
}

// pairOf names the (node, module) pair of a worker pod.
func pairOf(p *corev1.Pod) string {
	return p.Spec.NodeName + "/" + p.Labels[contract.LabelModuleNamespace] + "/" + p.Labels[contract.LabelModuleName]
}

// Create holds back a worker pod whose pair awaits a deletion (TombstoneIgnored) and makes a slow
// create again under a fresh name (SlowCreateRenamed).
func (c *seededClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	pod, ok := workerPod(obj)
	if !ok {
		return c.Client.Create(ctx, obj, opts...)
	}
	if c.bugs[TombstoneIgnored] && c.m.awaiting(pairOf(pod)) {
		return apierrors.NewAlreadyExists(corev1.Resource("pods"), pod.Name)
	}
	if !c.bugs[SlowCreateRenamed] {
		return c.Client.Create(ctx, obj, opts...)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := c.Client.Create(cctx, obj, opts...)
	if err == nil || cctx.Err() == nil {
		return err
	}
	pod.Name += "-retry"
	return c.Client.Create(ctx, obj, opts...)
}

// Delete records a worker pod's deletion as awaited (TombstoneIgnored) and takes a DELETE
// without an answer as done (LostAnswerAsDeleted).
func (c *seededClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	pod, ok := workerPod(obj)
	if !ok {
		return c.Client.Delete(ctx, obj, opts...)
	}
	if c.bugs[TombstoneIgnored] {
		c.m.awaited.Store(pod.UID, pairOf(pod))
	}
	err := c.Client.Delete(ctx, obj, opts...)
	if c.bugs[LostAnswerAsDeleted] && lostAnswer(err) {
		c.m.lost.Store(pod.UID, true)
		err = nil
	}
	if err != nil {
		c.m.awaited.Delete(pod.UID)
	}
	return err
}

// lostAnswer says whether err is an answer that did not come from the API server: no connection,
// a connection cut, a gateway's 502 or 503.
func lostAnswer(err error) bool {
	return err != nil && (apierrors.IsUnexpectedServerError(err) || utilnet.IsConnectionRefused(err) ||
		utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err))
}

// Patch swallows the uncordon of a node this process did not cordon (ForgetCordon) or whose
// cordon it left to somebody else after a conflict (ConflictDisownsCordon).
func (c *seededClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	node, ok := obj.(*corev1.Node)
	cordon, sets := unschedulable(obj, patch)
	if !ok || !sets {
		return c.Client.Patch(ctx, obj, patch, opts...)
	}
	if cordon {
		if c.bugs[ForgetCordon] {
			c.m.cordoned.Store(node.Name, true)
		}
		return c.Client.Patch(ctx, obj, patch, opts...)
	}
	if _, mine := c.m.cordoned.Load(node.Name); c.bugs[ForgetCordon] && !mine {
		return nil
	}
	if _, theirs := c.m.disowned.Load(node.Name); theirs {
		return nil
	}
	err := c.Client.Patch(ctx, obj, patch, opts...)
	if c.bugs[ConflictDisownsCordon] && apierrors.IsConflict(err) {
		c.m.disowned.Store(node.Name, true)
		return nil
	}
	return err
}

// unschedulable reads a merge patch of a Node: whether it sets spec.unschedulable, and to what.
func unschedulable(obj client.Object, patch client.Patch) (value, sets bool) {
	if patch.Type() != types.MergePatchType {
		return false, false
	}
	data, err := patch.Data(obj)
	if err != nil {
		return false, false
	}
	var p struct {
		Spec struct {
			Unschedulable *bool `json:"unschedulable"`
		} `json:"spec"`
	}
	if json.Unmarshal(data, &p) != nil || p.Spec.Unschedulable == nil {
		return false, false
	}
	return *p.Spec.Unschedulable, true
}

// List is the manager's list; a list of kmm's pods on one node (the NMC controller's facts) hides
// the pods taken as deleted (LostAnswerAsDeleted).
func (c *seededClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	pods, ok := list.(*corev1.PodList)
	if !ok || !kmmPodsOfNode(opts) {
		return nil
	}
	if c.bugs[LostAnswerAsDeleted] {
		pods.Items = keep(pods.Items, func(p *corev1.Pod) bool { _, gone := c.m.lost.Load(p.UID); return !gone })
	}
	return nil
}

// kmmPodsOfNode says whether a list selects kmm's pods (LabelManagedBy) on one node.
func kmmPodsOfNode(opts []client.ListOption) bool {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	if lo.FieldSelector == nil || lo.LabelSelector == nil {
		return false
	}
	_, one := lo.FieldSelector.RequiresExactMatch(contract.PodNodeNameField)
	by, _ := lo.LabelSelector.RequiresExactMatch(contract.LabelManagedBy)
	return one && by == contract.ManagedBy
}

// keep is the pods for which ok holds, in a new slice.
func keep(pods []corev1.Pod, ok func(*corev1.Pod) bool) []corev1.Pod {
	var out []corev1.Pod
	for i := range pods {
		if ok(&pods[i]) {
			out = append(out, pods[i])
		}
	}
	return out
}
