package node

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

func hookedIntent(action contract.Action) *fsm.WorkerIntent {
	in := intent("", true)
	in.Action = action
	hook := func(arg string) *kmmv1beta1.ModuleHook {
		return &kmmv1beta1.ModuleHook{Image: "reg/hooks:1", Args: []string{arg},
			HostPaths: []string{"/sys/bus/pci"}}
	}
	in.Entry.Hooks = &kmmv1beta1.ModuleHooks{PostLoad: hook("post-load"), PreUnload: hook("pre-unload")}
	return in
}

// TestHookPodShape: a load pod runs the worker, then the postLoad hook; an unload pod the
// preUnload hook, then the worker; both hooks with the worker's hardening, the node's modules
// read-only, their host paths, the Module's pull secret for the hook's image, and a log tail.
func TestHookPodShape(t *testing.T) {
	for _, tc := range []struct {
		action      contract.Action
		first, then string
	}{
		{contract.ActionLoad, contract.ContainerName, contract.PostLoadHookContainer},
		{contract.ActionUnload, contract.PreUnloadHookContainer, contract.ContainerName},
	} {
		pod, err := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, hookedIntent(tc.action))
		if err != nil {
			t.Fatal(err)
		}
		if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Containers) != 1 ||
			pod.Spec.InitContainers[0].Name != tc.first || pod.Spec.Containers[0].Name != tc.then {
			t.Fatalf("%s: containers %v then %v, want %s then %s", tc.action, names(pod.Spec.InitContainers), names(pod.Spec.Containers), tc.first, tc.then)
		}
		hook := pod.Spec.Containers[0]
		if tc.action == contract.ActionUnload {
			hook = pod.Spec.InitContainers[0]
		}
		sc := hook.SecurityContext
		switch {
		case *sc.Privileged || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || sc.Capabilities.Add[0] != "SYS_MODULE":
			t.Errorf("%s: hook security context %+v, want the worker's", tc.action, sc)
		case hook.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError:
			t.Errorf("%s: termination message policy %q", tc.action, hook.TerminationMessagePolicy)
		case len(pod.Spec.ImagePullSecrets) != 1 || pod.Spec.ImagePullSecrets[0].Name != "pull":
			t.Errorf("%s: image pull secrets %v", tc.action, pod.Spec.ImagePullSecrets)
		case !mounted(pod, hook, "/sys/bus/pci", "/sys/bus/pci") || !mounted(pod, hook, "/lib/modules", "/lib/modules"):
			t.Errorf("%s: hook mounts %+v", tc.action, hook.VolumeMounts)
		}
		if !strings.Contains(strings.Join(hook.Args, " "), strings.TrimSuffix(strings.TrimSuffix(tc.then, "-hook"), "worker")) && tc.action == contract.ActionLoad {
			t.Errorf("load pod's hook args %v", hook.Args)
		}
	}
	// No hook for the action: the pod is the worker alone.
	in := hookedIntent(contract.ActionUnload)
	in.Entry.Hooks.PreUnload = nil
	pod, _ := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, in)
	if len(pod.Spec.InitContainers) != 0 || pod.Spec.ImagePullSecrets != nil {
		t.Errorf("an unload with only a postLoad hook has init containers %v", names(pod.Spec.InitContainers))
	}
}

func names(cs []corev1.Container) []string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return n
}

// mounted says whether c mounts the host path hostPath at mountPath.
func mounted(pod *corev1.Pod, c corev1.Container, hostPath, mountPath string) bool {
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && m.MountPath == mountPath && v.HostPath != nil && v.HostPath.Path == hostPath {
				return true
			}
		}
	}
	return false
}

func terminated(name string, code int32, msg string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg}}}
}

// TestObserveHookFailures: a failed hook is the pair's failure with the hook's reason and the tail
// of its log; a failed postLoad hook keeps the worker's boot ID (the module is loaded).
func TestObserveHookFailures(t *testing.T) {
	ok, _ := contract.Result{Outcome: contract.OutcomeSucceeded, Action: contract.ActionLoad, Namespace: "drivers", Name: "nic", BootID: "b1"}.Marshal()
	long := strings.Repeat("x", 3000) + "the end"

	load, _ := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, hookedIntent(contract.ActionLoad))
	load.Status.Phase = corev1.PodFailed
	load.Status.InitContainerStatuses = []corev1.ContainerStatus{terminated(contract.ContainerName, 0, string(ok))}
	load.Status.ContainerStatuses = []corev1.ContainerStatus{terminated(contract.PostLoadHookContainer, 3, long)}
	w := ObserveWorker(load)
	r := w.Result
	if r.Reason != fsm.ReasonPostLoadHookFailed || r.BootID != "b1" || !strings.HasSuffix(r.Message, "the end") || len(r.Message) > maxHookMessage+len("…") {
		t.Errorf("postLoad failure observed as %+v (message %d bytes)", r, len(r.Message))
	}

	unload, _ := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, hookedIntent(contract.ActionUnload))
	unload.Status.Phase = corev1.PodFailed
	unload.Status.InitContainerStatuses = []corev1.ContainerStatus{terminated(contract.PreUnloadHookContainer, 1, "echo: write error: Device or resource busy")}
	unload.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: contract.ContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
	r = ObserveWorker(unload).Result
	if r.Reason != fsm.ReasonPreUnloadHookFailed || r.Message != "the pre-unload hook exited 1: echo: write error: Device or resource busy" {
		t.Errorf("preUnload failure observed as %+v", r)
	}

	// A hook that never started (its image cannot be pulled) until the pod's deadline.
	unload.Status.Reason, unload.Status.Message = "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
	unload.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: contract.PreUnloadHookContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}
	r = ObserveWorker(unload).Result
	if r.Reason != fsm.ReasonPreUnloadHookFailed || !strings.Contains(r.Message, "DeadlineExceeded") || !strings.Contains(r.Message, "ImagePullBackOff") {
		t.Errorf("a preUnload hook that never ran observed as %+v", r)
	}

	// The worker of a load pod failed: its own failure, the hook never ran.
	bad, _ := contract.Result{Outcome: contract.OutcomeFailed, Action: contract.ActionLoad, Reason: contract.ReasonNotFound, Message: "modprobe: not found"}.Marshal()
	load.Status.InitContainerStatuses = []corev1.ContainerStatus{terminated(contract.ContainerName, 1, string(bad))}
	load.Status.ContainerStatuses = nil
	if r = ObserveWorker(load).Result; r.Reason != contract.ReasonNotFound {
		t.Errorf("a failed worker in a load pod observed as %+v", r)
	}
}
