package agent

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kmm-project/kmm/contract"
)

// hookEnd is how the hook container of a worker pod ends, as a kubelet orders the pod's init
// container and container: a preUnload hook (first) before the worker, a postLoad hook after it.
type hookEnd struct {
	name    string
	first   bool
	exit    int32
	message string
}

// hookOf is the hook of pod, ending as v says; nil for a pod without one.
func hookOf(pod *corev1.Pod, v Verdict) *hookEnd {
	if len(pod.Spec.InitContainers) == 0 {
		return nil
	}
	if first := pod.Spec.InitContainers[0]; first.Name != contract.ContainerName {
		return &hookEnd{name: first.Name, first: true, exit: v.HookExit, message: v.HookMessage}
	}
	return &hookEnd{name: pod.Spec.Containers[0].Name, exit: v.HookExit, message: v.HookMessage}
}

// place moves the worker's terminal status where the kubelet reports it and adds the hook's: a
// failed first container leaves the second waiting and the pod Failed; the pod succeeds only when
// both exited 0.
func (h *hookEnd) place(p *corev1.Pod, now metav1.Time) {
	if h == nil {
		return
	}
	worker := p.Status.ContainerStatuses[0]
	hook := corev1.ContainerStatus{Name: h.name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: h.exit, Message: h.message, StartedAt: now, FinishedAt: now, Reason: reasonCompleted}}}
	if h.exit != 0 {
		hook.State.Terminated.Reason = reasonError
	}
	waiting := func(name string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}
	}
	switch {
	case h.first && h.exit != 0:
		p.Status.InitContainerStatuses, p.Status.ContainerStatuses = []corev1.ContainerStatus{hook}, []corev1.ContainerStatus{waiting(contract.ContainerName)}
		p.Status.Phase = corev1.PodFailed
	case h.first:
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{hook}
	case worker.State.Terminated == nil || worker.State.Terminated.ExitCode != 0:
		p.Status.InitContainerStatuses, p.Status.ContainerStatuses = []corev1.ContainerStatus{worker}, []corev1.ContainerStatus{waiting(h.name)}
	default:
		p.Status.InitContainerStatuses, p.Status.ContainerStatuses = []corev1.ContainerStatus{worker}, []corev1.ContainerStatus{hook}
		if h.exit != 0 {
			p.Status.Phase = corev1.PodFailed
		}
	}
}
