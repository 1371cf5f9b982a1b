package node

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/chaosbug"
)

// cordonsSetHere are the nodes this process cordoned, kept only for the seeded bug
// chaosbug.ForgetCordon (off in production builds: see internal/chaosbug).
var cordonsSetHere sync.Map

// rememberCordon records a cordon this process set (the seeded bug only).
func rememberCordon(node string) {
	if chaosbug.Enabled(chaosbug.ForgetCordon) {
		cordonsSetHere.Store(node, true)
	}
}

// forgetsCordon is the seeded bug: a cordon set by an earlier process is not lifted.
func forgetsCordon(node string) bool {
	if !chaosbug.Enabled(chaosbug.ForgetCordon) {
		return false
	}
	_, mine := cordonsSetHere.Load(node)
	return !mine
}

// errorAsNoPods is the seeded bug chaosbug.ErrorAsNoPods: a failed read of a drain's workload pods
// is taken as an empty list.
func errorAsNoPods(err error) bool {
	return err != nil && chaosbug.Enabled(chaosbug.ErrorAsNoPods)
}

// createPod creates a worker pod. With the seeded bug chaosbug.SlowCreateRenamed a create not
// answered within a second is taken as lost and made again at once under a fresh name.
func (r *NMCReconciler) createPod(ctx context.Context, pod *corev1.Pod) error {
	if !chaosbug.Enabled(chaosbug.SlowCreateRenamed) {
		return r.Client.Create(ctx, pod)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := r.Client.Create(cctx, pod)
	if err == nil || cctx.Err() == nil {
		return err
	}
	pod.Name += "-retry"
	return r.Client.Create(ctx, pod)
}

// awaitedDeletions are, for the seeded bug chaosbug.TombstoneIgnored, the worker pods this process
// deleted whose delete event it has not seen: pod UID → "node/namespace/module".
var awaitedDeletions sync.Map

// awaitDeletion records a worker pod about to be deleted (the seeded bug only).
func awaitDeletion(p *corev1.Pod) {
	if chaosbug.Enabled(chaosbug.TombstoneIgnored) {
		awaitedDeletions.Store(p.UID, p.Spec.NodeName+"/"+p.Labels[contract.LabelModuleNamespace]+"/"+p.Labels[contract.LabelModuleName])
	}
}

// deletionSent forgets the record of a deletion that failed (the seeded bug only).
func deletionSent(p *corev1.Pod, err error) {
	if err != nil {
		awaitedDeletions.Delete(p.UID)
	}
}

// deletionAwaited says whether the pair key on node waits for a deletion event (the seeded bug only).
func deletionAwaited(node, key string) bool {
	if !chaosbug.Enabled(chaosbug.TombstoneIgnored) {
		return false
	}
	waiting := false
	awaitedDeletions.Range(func(_, v any) bool {
		waiting = waiting || v == node+"/"+key
		return !waiting
	})
	return waiting
}

// watchDeletions is the seeded bugs' event handler: it meets the awaited deletions on delete
// events, and ignores a deletion delivered as a tombstone (cache.DeletedFinalStateUnknown)
// (chaosbug.TombstoneIgnored); it forgets the pods struck from the facts on any delete event
// (chaosbug.LostAnswerAsDeleted).
func watchDeletions(mgr ctrl.Manager) error {
	if !chaosbug.Enabled(chaosbug.TombstoneIgnored) && !chaosbug.Enabled(chaosbug.LostAnswerAsDeleted) {
		return nil
	}
	inf, err := mgr.GetCache().GetInformer(context.Background(), &corev1.Pod{})
	if err != nil {
		return err
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			awaitedDeletions.Delete(p.UID)
			lostDeletes.Delete(p.UID)
		}
		if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			if p, ok := t.Obj.(*corev1.Pod); ok {
				lostDeletes.Delete(p.UID)
			}
		}
	}})
	return err
}

// lostDeletes are, for the seeded bug chaosbug.LostAnswerAsDeleted, the worker pods whose DELETE
// got no answer from the API server, taken as deleted: struck from the facts until their delete
// event (pod UID → true).
var lostDeletes sync.Map

// lostAsDeleted is the seeded bug's reading of a worker pod DELETE's error: an answer that did not
// come from the API server (no connection, a connection cut, a gateway's 502 or 503) is taken as a
// delete that "must have reached the server", so the pod is taken as deleted.
func lostAsDeleted(p *corev1.Pod, err error) error {
	if err == nil || !chaosbug.Enabled(chaosbug.LostAnswerAsDeleted) {
		return err
	}
	if !apierrors.IsUnexpectedServerError(err) && !utilnet.IsConnectionRefused(err) && !utilnet.IsConnectionReset(err) &&
		!utilnet.IsProbableEOF(err) {
		return err
	}
	lostDeletes.Store(p.UID, true)
	return nil
}

// hideLostDeletes strikes the worker pods taken as deleted from f (the seeded bug only).
func hideLostDeletes(f *nodeFacts) {
	if !chaosbug.Enabled(chaosbug.LostAnswerAsDeleted) {
		return
	}
	for key, p := range f.workers {
		if _, gone := lostDeletes.Load(p.UID); gone {
			delete(f.workers, key)
		}
	}
}

// disownedCordons are the nodes whose uncordon met a conflict (the seeded bug
// chaosbug.ConflictDisownsCordon).
var disownedCordons sync.Map

// uncordoned is the seeded bug's reading of an uncordon's error: a conflict leaves the cordon to
// whoever changed the node.
func uncordoned(node string, err error) error {
	if chaosbug.Enabled(chaosbug.ConflictDisownsCordon) && apierrors.IsConflict(err) {
		disownedCordons.Store(node, true)
		return nil
	}
	return err
}

// cordonDisowned says whether kmm left node's cordon to somebody else (the seeded bug only).
func cordonDisowned(node string) bool {
	_, ok := disownedCordons.Load(node)
	return ok
}

// liveDevicePlugins reads the node's device plugin pods live, for the seeded bugs
// chaosbug.ThrottleSkipsDPCheck (a throttled read taken as none) and chaosbug.StallAsNoDevicePlugin
// (a read given 300 ms, and taken as none when it runs out of them).
func (r *NMCReconciler) liveDevicePlugins(ctx context.Context, f *nodeFacts, node string) error {
	throttle, stall := chaosbug.Enabled(chaosbug.ThrottleSkipsDPCheck), chaosbug.Enabled(chaosbug.StallAsNoDevicePlugin)
	if !throttle && !stall || r.APIReader == nil {
		return nil
	}
	lctx, cancel := context.WithCancel(ctx)
	if stall {
		lctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	}
	defer cancel()
	pods := &corev1.PodList{}
	err := r.APIReader.List(lctx, pods, client.HasLabels{contract.LabelDevicePlugin}, client.MatchingFields{"spec.nodeName": node})
	if throttle && apierrors.IsTooManyRequests(err) || stall && err != nil && errors.Is(lctx.Err(), context.DeadlineExceeded) {
		clear(f.dpRunning)
		return nil
	}
	for i := range pods.Items {
		collectPod(f, &pods.Items[i], node)
	}
	return err
}
