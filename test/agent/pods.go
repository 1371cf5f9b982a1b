package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
)

// Exit codes and reasons of the simulated worker container.
const (
	exitSucceeded   = 0
	exitFailed      = 1
	reasonCompleted = "Completed"
	reasonError     = "Error"
)

// isWorkerPod says whether pod is a worker pod (label contract.LabelWorker=true).
func isWorkerPod(pod *corev1.Pod) bool { return pod.Labels[contract.LabelWorker] == "true" }

// isTerminal says whether pod has ended.
func isTerminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// podStep is what the agent does next with a worker pod.
type podStep int

const (
	stepNone    podStep = iota // not the agent's, NotReady, ended or finished: nothing
	stepConfirm                // deleted: confirm the deletion
	stepRunning                // held or within RunDelay: show it Running
	stepRun                    // end it with the outcome of its run
	stepReject                 // refuse it as the kubelet's eviction manager does under pressure
)

// nextStep decides what to do with pod and returns its node; a.mu is held.
func (a *Agent) nextStep(pod *corev1.Pod) (*nodeState, podStep) {
	st := a.nodes[pod.Spec.NodeName]
	switch {
	case st == nil || !st.ready:
		return st, stepNone
	case pod.DeletionTimestamp != nil:
		return st, stepConfirm
	case isTerminal(pod) || a.finished[pod.UID]:
		return st, stepNone
	}
	if _, seen := a.seen[pod.UID]; !seen && !admitUnderPressure(st, pod) {
		return st, stepReject
	}
	now := a.clock.Now()
	first, ok := a.seen[pod.UID]
	if !ok {
		first = now
		a.seen[pod.UID] = now
	}
	delay := a.opts.RunDelay
	if a.opts.RunDelayFor != nil {
		delay = a.opts.RunDelayFor(pod)
	}
	if (a.hold != nil && a.hold(pod)) || now.Sub(first) < delay {
		return st, stepRunning
	}
	return st, stepRun
}

// syncPod moves one worker pod (as cached) along: confirm its deletion, hold it Running, or end it.
// Pods on nodes the agent does not manage, or on NotReady nodes, are left alone. It holds the
// agent's lock throughout, so a test sees a pod's end and its bookkeeping together.
func (a *Agent) syncPod(ctx context.Context, pod *corev1.Pod) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch st, step := a.nextStep(pod); step {
	case stepConfirm:
		return a.confirmDeletion(ctx, st, pod)
	case stepRunning:
		return a.markRunning(ctx, pod)
	case stepRun:
		return a.runPod(ctx, st, pod)
	case stepReject:
		return a.rejectPod(ctx, pod)
	}
	return nil
}

// systemCriticalPriority is the priority from which the kubelet counts a pod critical
// (system-cluster-critical; system-node-critical is above it).
const systemCriticalPriority = 2000000000

// admitUnderPressure is the kubelet eviction manager's admission of a new pod on a node under
// pressure (see SetPressure).
func admitUnderPressure(st *nodeState, pod *corev1.Pod) bool {
	var conds []corev1.NodeConditionType
	for c, on := range st.pressure {
		if on {
			conds = append(conds, c)
		}
	}
	switch {
	case len(conds) == 0, pod.Spec.Priority != nil && *pod.Spec.Priority >= systemCriticalPriority:
		return true
	case len(conds) == 1 && conds[0] == corev1.NodeMemoryPressure:
		return !bestEffort(pod) || slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool {
			return (t.Key == corev1.TaintNodeMemoryPressure || t.Key == "") && t.Operator == corev1.TolerationOpExists &&
				(t.Effect == "" || t.Effect == corev1.TaintEffectNoSchedule)
		})
	}
	return false
}

// bestEffort says whether no container of pod requests or limits anything.
func bestEffort(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if len(c.Resources.Requests) > 0 || len(c.Resources.Limits) > 0 {
			return false
		}
	}
	return true
}

// rejectPod fails pod as the kubelet does when its admission refuses it: phase Failed, reason
// Evicted, no container ever started.
func (a *Agent) rejectPod(ctx context.Context, pod *corev1.Pod) error {
	a.finished[pod.UID] = true
	_, err := a.updatePodStatus(ctx, pod, func(p *corev1.Pod) bool {
		if isTerminal(p) {
			return false
		}
		p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted"
		p.Status.Message = "Pod was rejected: The node had condition: [" + pressureList(a.nodes[p.Spec.NodeName]) + "]. "
		return true
	})
	return err
}

// pressureList names the pressure conditions of st that are True.
func pressureList(st *nodeState) string {
	var out []string
	for c, on := range st.pressure {
		if on {
			out = append(out, string(c))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// waits says whether pod needs a look again as time passes: a worker pod that the agent saw
// runnable but did not end (held by Options.Hold, or within Options.RunDelay), or another pod whose
// deletion waits out Options.StopDelay.
func (a *Agent) waits(pod *corev1.Pod) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !isWorkerPod(pod) {
		_, stopping := a.stopping[pod.UID]
		return stopping && pod.DeletionTimestamp != nil && !a.deleted[pod.UID]
	}
	if pod.DeletionTimestamp != nil || isTerminal(pod) {
		return false
	}
	_, seen := a.seen[pod.UID]
	return seen && !a.finished[pod.UID]
}

// runPod ends pod with the outcome of its run and applies the run to the simulated kernel.
func (a *Agent) runPod(ctx context.Context, st *nodeState, pod *corev1.Pod) error {
	res, cfg, hook := a.decide(st, pod)
	wrote, err := a.finishPod(ctx, pod, res, hook)
	if err != nil {
		return err
	}
	a.finished[pod.UID] = true
	if wrote {
		a.applyRun(st, pod, res, cfg)
	}
	return nil
}

// applyRun applies a run that was written to the simulated kernel and records it; a.mu is held.
func (a *Agent) applyRun(st *nodeState, pod *corev1.Pod, res contract.Result, cfg *contract.Config) {
	if cfg != nil && res.Outcome == contract.OutcomeSucceeded {
		switch res.Action {
		case contract.ActionLoad, contract.ActionReload:
			st.loaded[cfg.ModuleID()] = *cfg.Config.DeepCopy()
		case contract.ActionUnload:
			delete(st.loaded, cfg.ModuleID())
		}
	}
	if cfg != nil && res.Action == contract.ActionReload && res.FailedStep == contract.StepLoad {
		delete(st.loaded, cfg.ModuleID()) // the previous config was unloaded, the new one did not load
	}
	a.record(st.name, pod, res)
}

// decide is the Result of running pod on st now, and the config it ran with (nil when the pod's
// config or action is unusable, which fails the run as the real worker would).
func (a *Agent) decide(st *nodeState, pod *corev1.Pod) (contract.Result, *contract.Config, *hookEnd) {
	cfg, err := contract.ParseConfig([]byte(pod.Annotations[contract.AnnotationConfig]))
	if err != nil {
		res := podResult(pod, st.bootID, err.Error())
		res.Reason = contract.ReasonInvalidConfig // as the real worker reports a config it refuses
		return res, nil, nil
	}
	action := contract.Action(pod.Labels[contract.LabelAction])
	if action != contract.ActionLoad && action != contract.ActionUnload && action != contract.ActionReload {
		return podResult(pod, st.bootID, fmt.Sprintf("unknown action %q", action)), nil, nil
	}
	in := RunInput{Node: st.name, NodeKernel: st.kernel, BootID: st.bootID, Action: action, Config: cfg, Pod: pod}
	v := a.outcome(in)
	if v.Outcome != contract.OutcomeSucceeded {
		v.Outcome = contract.OutcomeFailed
		if v.Reason == "" {
			v.Reason = contract.ReasonOther
		}
	} else {
		v.Reason = ""
	}
	hook := hookOf(pod, v)
	if hook != nil && hook.first && hook.exit != 0 {
		// The preUnload hook failed: the worker never ran, the module stays loaded.
		v = Failed(contract.ReasonOther, "the worker did not run: its preUnload hook failed")
	}
	return buildResult(in, st.bootID, v), &cfg, hook
}

// failPod ends pod as Failed with reason Other and message, reporting bootID, without running it.
func (a *Agent) failPod(ctx context.Context, st *nodeState, pod *corev1.Pod, bootID, message string) error {
	res := podResult(pod, bootID, message)
	wrote, err := a.finishPod(ctx, pod, res, nil)
	if err != nil {
		return err
	}
	a.finished[pod.UID] = true
	if wrote {
		a.record(st.name, pod, res)
	}
	return nil
}

// confirmDeletion does what a kubelet does for a terminating pod: end it if it still runs, then
// delete it with grace period 0 so that the API server removes it.
func (a *Agent) confirmDeletion(ctx context.Context, st *nodeState, pod *corev1.Pod) error {
	if a.deleted[pod.UID] {
		return nil
	}
	if !isTerminal(pod) && !a.finished[pod.UID] {
		if err := a.failPod(ctx, st, pod, st.bootID, "the worker pod was deleted before it finished"); err != nil {
			return err
		}
	}
	if err := a.deletePod(ctx, pod); err != nil {
		return err
	}
	a.deleted[pod.UID] = true
	return nil
}

// deletePod deletes pod with grace period 0, as a kubelet confirms a deletion; a pod already gone
// or replaced is not an error.
func (a *Agent) deletePod(ctx context.Context, pod *corev1.Pod) error {
	if removedByAPIServer(pod) {
		return nil
	}
	uid := pod.UID
	err := a.client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// markRunning makes a pod that has not ended look like a running one.
func (a *Agent) markRunning(ctx context.Context, pod *corev1.Pod) error {
	if pod.Status.Phase == corev1.PodRunning {
		return nil
	}
	now := a.now()
	_, err := a.updatePodStatus(ctx, pod, func(p *corev1.Pod) bool {
		if isTerminal(p) || p.Status.Phase == corev1.PodRunning {
			return false
		}
		p.Status.Phase, p.Status.StartTime = corev1.PodRunning, &now
		p.Status.ContainerStatuses = []corev1.ContainerStatus{containerStatus(p, corev1.ContainerState{
			Running: &corev1.ContainerStateRunning{StartedAt: now},
		})}
		return true
	})
	return err
}

// finishPod writes res as pod's terminal status unless the pod already ended. It reports whether it
// wrote; a pod that is gone is not an error.
func (a *Agent) finishPod(ctx context.Context, pod *corev1.Pod, res contract.Result, hook *hookEnd) (bool, error) {
	msg, err := res.Marshal()
	if err != nil {
		return false, fmt.Errorf("encoding the result of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	now := a.now()
	return a.updatePodStatus(ctx, pod, func(p *corev1.Pod) bool {
		if isTerminal(p) {
			return false
		}
		setTerminated(p, res.Outcome, string(msg), now)
		hook.place(p, now)
		return true
	})
}

// setTerminated gives p the terminal status of a worker container that ended with outcome at now.
func setTerminated(p *corev1.Pod, outcome contract.Outcome, message string, now metav1.Time) {
	phase, code, reason := corev1.PodSucceeded, int32(exitSucceeded), reasonCompleted
	if outcome != contract.OutcomeSucceeded {
		phase, code, reason = corev1.PodFailed, exitFailed, reasonError
	}
	started := now
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == contract.ContainerName && cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
	}
	if p.Status.StartTime == nil {
		p.Status.StartTime = &started
	}
	p.Status.Phase = phase
	p.Status.ContainerStatuses = []corev1.ContainerStatus{containerStatus(p, corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: message,
			StartedAt: started, FinishedAt: now, ContainerID: containerID(p)},
	})}
}

// containerStatus is the status of p's worker container in state.
func containerStatus(p *corev1.Pod, state corev1.ContainerState) corev1.ContainerStatus {
	image := ""
	for _, c := range p.Spec.Containers {
		if c.Name == contract.ContainerName {
			image = c.Image
		}
	}
	running := state.Running != nil
	return corev1.ContainerStatus{Name: contract.ContainerName, Image: image, ImageID: ImageDigest(image),
		ContainerID: containerID(p), State: state, Ready: running, Started: &running}
}

// containerID is the simulated container runtime's ID of p's worker container.
func containerID(p *corev1.Pod) string { return "kmm-test-agent://" + string(p.UID) }

// updatePodStatus lets mutate change pod (re-read after a conflict) (false: nothing to write) and writes its
// status, retrying on conflicts. It reports whether it wrote; a deleted or replaced pod is not an error.
func (a *Agent) updatePodStatus(ctx context.Context, pod *corev1.Pod, mutate func(*corev1.Pod) bool) (bool, error) {
	wrote, fresh := false, false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		wrote = false
		// The first attempt writes over the cached pod (a stale one fails with a conflict); the
		// retries re-read it.
		p := pod.DeepCopy()
		if fresh {
			p = &corev1.Pod{}
			if err := a.client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, p); err != nil {
				return err
			}
		}
		fresh = true
		if p.UID != pod.UID || !mutate(p) {
			return nil
		}
		if err := a.client.Status().Update(ctx, p); err != nil {
			return err
		}
		wrote = true
		return nil
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("updating the status of pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return wrote, nil
}

// record appends a run to the history.
func (a *Agent) record(node string, pod *corev1.Pod, res contract.Result) {
	a.runs = append(a.runs, Run{Node: node, Namespace: pod.Namespace, Pod: pod.Name, UID: pod.UID,
		Module: res.Namespace + "/" + res.Name, Action: res.Action, Result: res, Time: a.clock.Now()})
}

// syncOtherPod runs a pod that is not a worker pod (a device plugin, a workload) as a kubelet
// would: it becomes Running and Ready, and a deleted one goes away at once.
func (a *Agent) syncOtherPod(ctx context.Context, pod *corev1.Pod) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.nodes[pod.Spec.NodeName]
	if st == nil || !st.ready {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		if a.stillStopping(pod) {
			return nil
		}
		return a.deleteNow(ctx, pod)
	}
	if isTerminal(pod) || isReady(pod) {
		return nil
	}
	now := a.now()
	_, err := a.updatePodStatus(ctx, pod, func(p *corev1.Pod) bool {
		if isTerminal(p) || isReady(p) {
			return false
		}
		p.Status.Phase, p.Status.StartTime = corev1.PodRunning, &now
		p.Status.Conditions = []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		}
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptrTrue(),
				ContainerID: containerID(p) + "/" + c.Name, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
		return true
	})
	return err
}

// stillStopping says whether a deleted pod that is not a worker pod is within StopDelay of the
// agent's first sight of its deletion (a.mu held).
func (a *Agent) stillStopping(pod *corev1.Pod) bool {
	if a.opts.StopDelay <= 0 || a.deleted[pod.UID] {
		return false
	}
	now := a.clock.Now()
	first, ok := a.stopping[pod.UID]
	if !ok {
		first = now
		a.stopping[pod.UID] = now
	}
	return now.Sub(first) < a.opts.StopDelay
}

// isValidationPod says whether pod is a rollout's validation pod (label contract.LabelValidation).
func isValidationPod(pod *corev1.Pod) bool { return pod.Labels[contract.LabelValidation] == "true" }

// syncValidationPod runs a validation pod to its end, as SetValidationOutcome says (a kubelet runs
// the user's container; restartPolicy Never): Succeeded with exit code 0, or Failed with exit code
// 1 and the message as the container's termination message.
func (a *Agent) syncValidationPod(ctx context.Context, pod *corev1.Pod) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.nodes[pod.Spec.NodeName]
	if st == nil || !st.ready {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		return a.deleteNow(ctx, pod)
	}
	if isTerminal(pod) {
		return nil
	}
	ok, msg := true, ""
	if a.validation != nil {
		ok, msg = a.validation(pod)
	}
	now := a.now()
	_, err := a.updatePodStatus(ctx, pod, func(p *corev1.Pod) bool {
		if isTerminal(p) {
			return false
		}
		phase, code, reason := corev1.PodSucceeded, int32(exitSucceeded), reasonCompleted
		if !ok {
			phase, code, reason = corev1.PodFailed, exitFailed, reasonError
		}
		p.Status.Phase, p.Status.StartTime = phase, &now
		p.Status.ContainerStatuses = nil
		for _, c := range p.Spec.Containers {
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg,
					StartedAt: now, FinishedAt: now}}})
		}
		return true
	})
	return err
}

// deleteNow confirms a pod's deletion with grace period 0, as a kubelet does once its containers
// stopped; finalizers still hold it until someone removes them.
func (a *Agent) deleteNow(ctx context.Context, pod *corev1.Pod) error {
	if a.deleted[pod.UID] {
		return nil
	}
	uid := pod.UID
	err := a.client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	a.deleted[pod.UID] = true
	delete(a.stopping, pod.UID)
	return nil
}

func isReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue && pod.Status.Phase == corev1.PodRunning
		}
	}
	return false
}

func ptrTrue() *bool {
	t := true
	return &t
}

// removedByAPIServer says whether the API server removes pod by itself: a pod that had ended when it
// was deleted gets grace period 0 and, without finalizers, is gone within the same request (the
// deletion the agent sees is its last update). Confirming it would only earn a NotFound.
func removedByAPIServer(pod *corev1.Pod) bool {
	g := pod.DeletionGracePeriodSeconds
	return isTerminal(pod) && g != nil && *g == 0 && len(pod.Finalizers) == 0
}
