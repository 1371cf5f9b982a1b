package node

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

// maxHookMessage bounds the tail of a failed hook's termination message (or log) kept in the pair's
// status message.
const maxHookMessage = 1024

// addHook puts the Module's hook for the intent's action into the worker pod (docs/api.md#hooks):
// a load pod runs the worker as its init container and the postLoad hook after it; an unload pod
// runs the preUnload hook as its init container and the worker after it. The kubelet orders them:
// with restartPolicy Never, a failed first container fails the pod and the second never starts.
func addHook(pod *corev1.Pod, node string, in *fsm.WorkerIntent, sandbox string) {
	h := in.Entry.Hooks
	if h == nil {
		return
	}
	spec := &pod.Spec
	worker := spec.Containers[0]
	switch {
	case in.Action == contract.ActionLoad && h.PostLoad != nil:
		spec.InitContainers = []corev1.Container{worker}
		spec.Containers = []corev1.Container{hookContainer(contract.PostLoadHookContainer, node, &in.Entry, h.PostLoad)}
		spec.Volumes = append(spec.Volumes, hookVolumes(h.PostLoad, sandbox)...)
	case in.Action == contract.ActionUnload && h.PreUnload != nil:
		spec.InitContainers = []corev1.Container{hookContainer(contract.PreUnloadHookContainer, node, &in.Entry, h.PreUnload)}
		spec.Volumes = append(spec.Volumes, hookVolumes(h.PreUnload, sandbox)...)
	default:
		return
	}
	if in.Entry.ImageRepoSecret != nil {
		spec.ImagePullSecrets = []corev1.LocalObjectReference{*in.Entry.ImageRepoSecret}
	}
}

// hookContainer is a hook as a container of the worker pod: the worker's security context (root,
// CAP_SYS_MODULE only, the runtime's seccomp profile, a read-only root file system) unless the hook
// asks to be privileged; the node's /lib/modules read-only, the pod's /tmp and its host paths.
func hookContainer(name, node string, e *kmmv1beta1.NodeModuleSpec, h *kmmv1beta1.ModuleHook) corev1.Container {
	env := append([]corev1.EnvVar{
		{Name: "KMM_NODE_NAME", Value: node},
		{Name: "KMM_MODULE_NAME", Value: e.Config.Modprobe.ModuleName},
		{Name: "KMM_KERNEL_VERSION", Value: e.Config.KernelVersion},
		{Name: "KMM_MODULE_VERSION", Value: e.Config.Version},
	}, h.Env...)
	mounts := []corev1.VolumeMount{
		{Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true},
		{Name: "tmp", MountPath: "/tmp"},
	}
	for i, p := range h.HostPaths {
		mounts = append(mounts, corev1.VolumeMount{Name: hookVolumeName(i), MountPath: p})
	}
	sc := workerSecurityContext(h.Privileged)
	return corev1.Container{
		Name:                     name,
		Image:                    h.Image,
		Command:                  h.Command,
		Args:                     h.Args,
		Env:                      env,
		ImagePullPolicy:          h.ImagePullPolicy,
		Resources:                h.Resources,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          sc,
		VolumeMounts:             mounts,
	}
}

func hookVolumeName(i int) string { return fmt.Sprintf("hook-host-%d", i) }

// hookVolumes are the hook's host paths (below the sandbox in a dry run).
func hookVolumes(h *kmmv1beta1.ModuleHook, sandbox string) []corev1.Volume {
	v := make([]corev1.Volume, 0, len(h.HostPaths))
	for i, p := range h.HostPaths {
		v = append(v, corev1.Volume{Name: hookVolumeName(i), VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: path.Join(sandbox, p), Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}})
	}
	return v
}

// containerStatus is the status of the pod's container (or init container) name.
func containerStatus(pod *corev1.Pod, name string) (corev1.ContainerStatus, bool) {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if cs.Name == name {
				return cs, true
			}
		}
	}
	return corev1.ContainerStatus{}, false
}

// hookFailure says how the pod's hook failed, if it did: the hook's reason, and a message with the
// tail of its termination message (or log), or why it never ended. A pod whose hook did not run
// (a load whose worker failed) or succeeded has none.
func hookFailure(pod *corev1.Pod, worker contract.Result) (contract.Result, bool) {
	name, reason := contract.PreUnloadHookContainer, fsm.ReasonPreUnloadHookFailed
	if len(pod.Spec.InitContainers) > 0 && pod.Spec.InitContainers[0].Name == contract.ContainerName {
		name, reason = contract.PostLoadHookContainer, fsm.ReasonPostLoadHookFailed
		if worker.Outcome != contract.OutcomeSucceeded {
			return contract.Result{}, false // the worker failed first: its own failure
		}
	} else if len(pod.Spec.InitContainers) == 0 {
		return contract.Result{}, false // no hook
	}
	cs, _ := containerStatus(pod, name)
	t := cs.State.Terminated
	if t != nil && t.ExitCode == 0 {
		return contract.Result{}, false
	}
	msg := "the " + strings.TrimSuffix(name, "-hook") + " hook did not finish: " + strings.TrimSpace(pod.Status.Reason+" "+pod.Status.Message)
	switch {
	case t != nil:
		msg = fmt.Sprintf("the %s hook exited %d: %s", strings.TrimSuffix(name, "-hook"), t.ExitCode, strings.TrimSpace(t.Message))
	case cs.State.Waiting != nil:
		msg += " (" + cs.State.Waiting.Reason + ")"
	}
	if len(msg) > maxHookMessage {
		msg = "…" + msg[len(msg)-maxHookMessage:]
	}
	r := worker // a load's boot ID and digest: the module is loaded
	r.Outcome, r.Reason, r.Message = contract.OutcomeFailed, contract.Reason(reason), msg
	return r, true
}
