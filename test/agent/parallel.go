package agent

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// syncPodsParallel moves worker pods along with Options.Workers goroutines; each pod is handled by
// one goroutine, and the call returns, when every pod was handled, those that need another look
// (see syncOne).
func (a *Agent) syncPodsParallel(ctx context.Context, pods []*corev1.Pod) []*corev1.Pod {
	if len(pods) == 0 {
		return nil
	}
	work := make(chan *corev1.Pod)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		again []*corev1.Pod
	)
	for range min(a.opts.Workers, len(pods)) {
		wg.Go(func() {
			for pod := range work {
				if a.syncOne(ctx, pod, a.syncPodUnlocked) {
					mu.Lock()
					again = append(again, pod)
					mu.Unlock()
				}
			}
		})
	}
	for _, pod := range pods {
		work <- pod
	}
	close(work)
	wg.Wait()
	return again
}

// syncPodUnlocked is syncPod with the API writes made without the agent's lock: the decisions and
// the bookkeeping take the lock, the writes do not.
func (a *Agent) syncPodUnlocked(ctx context.Context, pod *corev1.Pod) error {
	a.mu.Lock()
	st, step := a.nextStep(pod)
	switch step {
	case stepConfirm:
		return a.confirmDeletionUnlocked(ctx, st, pod)
	case stepRunning:
		a.mu.Unlock()
		return a.markRunning(ctx, pod)
	case stepNone:
		a.mu.Unlock()
		return nil
	}
	res, cfg, hook := a.decide(st, pod)
	a.mu.Unlock()

	wrote, err := a.finishPod(ctx, pod, res, hook)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.finished[pod.UID] = true
	if wrote {
		a.applyRun(st, pod, res, cfg)
	}
	return nil
}

// confirmDeletionUnlocked is confirmDeletion entered with a.mu held; it releases the lock for the
// API writes.
func (a *Agent) confirmDeletionUnlocked(ctx context.Context, st *nodeState, pod *corev1.Pod) error {
	if a.deleted[pod.UID] {
		a.mu.Unlock()
		return nil
	}
	fail := !isTerminal(pod) && !a.finished[pod.UID]
	bootID := st.bootID
	a.mu.Unlock()
	if fail {
		res := podResult(pod, bootID, "the worker pod was deleted before it finished")
		wrote, err := a.finishPod(ctx, pod, res, nil)
		if err != nil {
			return err
		}
		a.mu.Lock()
		a.finished[pod.UID] = true
		if wrote {
			a.record(st.name, pod, res)
		}
		a.mu.Unlock()
	}
	if err := a.deletePod(ctx, pod); err != nil {
		return err
	}
	a.mu.Lock()
	a.deleted[pod.UID] = true
	a.mu.Unlock()
	return nil
}
