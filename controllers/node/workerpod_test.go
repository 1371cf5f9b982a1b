package node

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

func intent(firmware string, secret bool) *fsm.WorkerIntent {
	e := kmmv1beta1.NodeModuleSpec{Namespace: "drivers", Name: "nic", ServiceAccountName: "loader",
		Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		Config: kmmv1beta1.ModuleConfig{KernelVersion: "6.1.0-56-cloud-amd64", ContainerImage: "reg/nic:1",
			Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "nic", DirName: "/opt", FirmwarePath: firmware}}}
	if secret {
		e.ImageRepoSecret = &corev1.LocalObjectReference{Name: "pull"}
	}
	return &fsm.WorkerIntent{Action: contract.ActionLoad, Attempt: 3, Entry: e}
}

// TestWorkerPodShape checks the pod of SPEC §6.
func TestWorkerPodShape(t *testing.T) {
	pod, err := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, intent("", true))
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	switch {
	case pod.Name != "kmm-worker-node-1-drivers-nic" || pod.Namespace != "drivers":
		t.Errorf("name %s/%s is not deterministic", pod.Namespace, pod.Name)
	case pod.Spec.NodeName != "node-1" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever:
		t.Errorf("nodeName %q restartPolicy %q", pod.Spec.NodeName, pod.Spec.RestartPolicy)
	case pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken:
		t.Error("the service account token is mounted")
	case *c.SecurityContext.Privileged || len(c.SecurityContext.Capabilities.Add) != 1 || c.SecurityContext.Capabilities.Add[0] != "SYS_MODULE":
		t.Errorf("security context %+v, want SYS_MODULE and not privileged", c.SecurityContext)
	case pod.Spec.ServiceAccountName != "loader" || len(pod.Spec.Tolerations) != 1:
		t.Errorf("service account %q tolerations %v", pod.Spec.ServiceAccountName, pod.Spec.Tolerations)
	case pod.Spec.PriorityClassName != "system-node-critical":
		t.Errorf("priority class %q: the kubelet refuses a pod that is not critical on a node under disk or PID pressure", pod.Spec.PriorityClassName)
	case strings.Join(c.Args, " ") != "load --config /etc/kmm/config.json --cache-dir /var/lib/kmm/cache --timeout 4m0s --pull-secret /var/run/kmm/pull-secret/.dockerconfigjson":
		t.Errorf("args %q", c.Args)
	case pod.Annotations[contract.AnnotationAttempt] != "3" || pod.Labels[contract.LabelWorker] != "true" || pod.Labels[contract.LabelManagedBy] != contract.ManagedBy:
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}
	cfg, err := contract.ParseConfig([]byte(pod.Annotations[contract.AnnotationConfig]))
	if err != nil || cfg.Config.ContainerImage != "reg/nic:1" || cfg.SetFirmwareClassPath {
		t.Errorf("config annotation %v: %+v", err, cfg)
	}
	if !hasDownwardConfig(pod) {
		t.Error("the config annotation is not mounted through the downward API")
	}
	checkWorkerHardening(t, pod)
}

// checkWorkerHardening is issue 13's item 9 and the pod side of item 3: least privilege, a
// deadline past the worker's own, bounded memory.
func checkWorkerHardening(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	sc := pod.Spec.Containers[0].SecurityContext
	switch {
	case pod.Spec.ActiveDeadlineSeconds == nil || *pod.Spec.ActiveDeadlineSeconds <= int64(contract.DefaultTimeout.Seconds()):
		t.Errorf("activeDeadlineSeconds %v, want more than the worker's own %v", pod.Spec.ActiveDeadlineSeconds, contract.DefaultTimeout)
	case len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL":
		t.Errorf("capabilities %+v: not dropping ALL", sc.Capabilities)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation allowed")
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("seccomp %+v", sc.SeccompProfile)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the root file system is writable")
	case pod.Spec.Containers[0].Resources.Limits.Memory().IsZero():
		t.Error("no memory limit")
	}
}

func hasDownwardConfig(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.DownwardAPI != nil && strings.Contains(v.DownwardAPI.Items[0].FieldRef.FieldPath, contract.AnnotationConfig) {
			return true
		}
	}
	return false
}

func TestWorkerPodIsPrivilegedOnlyForFirmware(t *testing.T) {
	pod, err := WorkerPod("n", WorkerPodOptions{Image: "img"}, intent("/firmware", false))
	if err != nil {
		t.Fatal(err)
	}
	if !*pod.Spec.Containers[0].SecurityContext.Privileged {
		t.Fatal("a firmware load needs a privileged pod to write /sys")
	}
	cfg, _ := contract.ParseConfig([]byte(pod.Annotations[contract.AnnotationConfig]))
	if !cfg.SetFirmwareClassPath || cfg.FirmwareHostPath != FirmwareHostPath {
		t.Fatalf("config %+v", cfg)
	}
	// containerd gives a privileged container on the pod network a read-only /sys: the firmware
	// class parameters come from the host, read-write, at their own path (make e2e-kernel found it).
	if !mountsHostDir(pod, FirmwareClassParameters, false) {
		t.Errorf("the firmware pod does not mount %s read-write from the host: %v %v", FirmwareClassParameters, pod.Spec.Containers[0].VolumeMounts, pod.Spec.Volumes)
	}
	pod, err = WorkerPod("n", WorkerPodOptions{Image: "img", LeaveFirmwareClassPath: true}, intent("/firmware", false))
	if err != nil {
		t.Fatal(err)
	}
	if mountsHostDir(pod, FirmwareClassParameters, false) {
		t.Errorf("the class path is left alone, yet the pod mounts %s", FirmwareClassParameters)
	}
}

// mountsHostDir says whether the pod's worker container mounts the host directory at the same path.
func mountsHostDir(pod *corev1.Pod, dir string, readOnly bool) bool {
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.MountPath != dir || m.ReadOnly != readOnly {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && v.HostPath.Path == dir {
				return true
			}
		}
	}
	return false
}

// TestWorkerPodDryRunSandbox checks the pod of --worker-dry-run-sandbox: the same pod but for the
// worker's dry-run flags and host paths below the sandbox, the real boot ID mounted into it, and no
// host path outside the sandbox but that file.
func TestWorkerPodDryRunSandbox(t *testing.T) {
	const sandbox = "/srv/kmm-sandbox"
	for _, firmware := range []string{"", "/firmware"} {
		real, err := WorkerPod("n", WorkerPodOptions{Image: "img"}, intent(firmware, true))
		if err != nil {
			t.Fatal(err)
		}
		pod, err := WorkerPod("n", WorkerPodOptions{Image: "img", DryRunSandbox: sandbox}, intent(firmware, true))
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0]
		if want := strings.Join(real.Spec.Containers[0].Args, " ") + " --dry-run --host-root " + SandboxMountPath; strings.Join(c.Args, " ") != want {
			t.Errorf("firmware %q: args %q, want %q", firmware, c.Args, want)
		}
		if *c.SecurityContext.Privileged != (firmware != "") || pod.Annotations[contract.AnnotationConfig] != real.Annotations[contract.AnnotationConfig] {
			t.Errorf("firmware %q: the security context or the config differ from a real node's pod", firmware)
		}
		hostPaths := map[string]string{}
		for _, v := range pod.Spec.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = v.HostPath.Path
			}
		}
		want := map[string]string{"cache": sandbox + CacheHostPath, "lib-modules": sandbox + "/lib/modules", "sandbox": sandbox, "boot-id": "/proc/sys/kernel/random/boot_id"}
		if !maps.Equal(hostPaths, want) {
			t.Errorf("firmware %q: host paths %v, want %v", firmware, hostPaths, want)
		}
		mounts := map[string]string{}
		for _, m := range c.VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
		if mounts["cache"] != CacheHostPath || mounts["sandbox"] != SandboxMountPath || mounts["boot-id"] != SandboxMountPath+"/proc/sys/kernel/random/boot_id" {
			t.Errorf("firmware %q: mounts %v", firmware, mounts)
		}
		if firmware == "" {
			checkWorkerHardening(t, pod)
		}
	}
}

func TestWorkerPodNameStaysValid(t *testing.T) {
	long := strings.Repeat("n", 250)
	if n := WorkerPodName(long, "ns", "m"); len(n) > 253 || n == WorkerPodName(long+"x", "ns", "m") {
		t.Fatalf("name %q (%d)", n, len(n))
	}
}

// TestObserveWorkerReadsTheResult round-trips a pod through ObserveWorker.
func TestObserveWorkerReadsTheResult(t *testing.T) {
	pod, _ := WorkerPod("n", WorkerPodOptions{Image: "img"}, intent("", true))
	res := contract.Result{Action: contract.ActionLoad, Namespace: "drivers", Name: "nic", Kernel: "k", BootID: "b7",
		ImageDigest: "sha256:ab", Outcome: contract.OutcomeFailed, Reason: contract.ReasonImagePull, Message: "manifest unknown"}
	msg, err := res.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: contract.ContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: string(msg), FinishedAt: metav1.Now()}}}}
	w := ObserveWorker(pod)
	if w.Phase != fsm.PodFailed || w.Action != contract.ActionLoad || w.Attempt != 3 || w.Result.Reason != "ImagePull" ||
		w.Result.BootID != "b7" || w.Entry.Config.ContainerImage != "reg/nic:1" || w.Entry.ImageRepoSecret == nil {
		t.Fatalf("observed %+v", w)
	}

	pod.Status.ContainerStatuses = nil
	pod.Status.Reason, pod.Status.Message = "Evicted", "node under memory pressure"
	if w := ObserveWorker(pod); w.Result.Reason != "Other" || !strings.Contains(w.Result.Message, "Evicted") {
		t.Fatalf("an evicted pod without a result: %+v", w.Result)
	}
}

// TestWorkerPodFirmwareSettings: the firmware directory and whether the class path is written are
// operator settings (upstream KMM installs to /lib/firmware and leaves the class path alone).
func TestWorkerPodFirmwareSettings(t *testing.T) {
	pod, err := WorkerPod("n", WorkerPodOptions{Image: "img", FirmwareHostPath: "/lib/firmware", LeaveFirmwareClassPath: true}, intent("/firmware", false))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := contract.ParseConfig([]byte(pod.Annotations[contract.AnnotationConfig]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SetFirmwareClassPath || cfg.FirmwareHostPath != "/lib/firmware" {
		t.Fatalf("config %+v: want /lib/firmware and the class path left alone", cfg)
	}
	var mounted, volume string
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.Name == "firmware" {
			mounted = m.MountPath
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "firmware" && v.HostPath != nil {
			volume = v.HostPath.Path
		}
	}
	if mounted != "/lib/firmware" || volume != "/lib/firmware" {
		t.Fatalf("firmware mounted at %q from host %q, want /lib/firmware for both", mounted, volume)
	}
}

// TestReloadWorkerPod: a reload pod carries both configs in its config annotation (the worker's
// Previous is the loaded one), is labelled reload, mounts firmware when the previous config had
// it, and its failed step reaches the decision.
func TestReloadWorkerPod(t *testing.T) {
	in := intent("", false)
	in.Action = contract.ActionReload
	prev := in.Entry.Config
	prev.ContainerImage, prev.Modprobe.FirmwarePath = "reg/nic:0", "/firmware"
	in.Previous = &prev
	pod, err := WorkerPod("n", WorkerPodOptions{Image: "img"}, in)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := contract.ParseConfig([]byte(pod.Annotations[contract.AnnotationConfig]))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.ValidateFor(contract.ActionReload); err != nil || cfg.Previous.ContainerImage != "reg/nic:0" || cfg.Config.ContainerImage != "reg/nic:1" {
		t.Fatalf("config %+v (%v): want previous reg/nic:0 and config reg/nic:1", cfg, err)
	}
	if pod.Labels[contract.LabelAction] != "reload" || pod.Spec.Containers[0].Args[0] != "reload" {
		t.Errorf("labels %v, args %v", pod.Labels, pod.Spec.Containers[0].Args)
	}
	if sc := pod.Spec.Containers[0].SecurityContext; sc.Privileged == nil || !*sc.Privileged {
		t.Error("the previous config's firmware is removed by the reload: the pod needs the firmware mount and privilege")
	}
	res := contract.Result{Action: contract.ActionReload, Namespace: "drivers", Name: "nic", Kernel: "k", BootID: "b",
		Outcome: contract.OutcomeFailed, Reason: contract.ReasonBusy, Message: "in use", FailedStep: contract.StepUnload}
	msg, _ := res.Marshal()
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: contract.ContainerName, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: string(msg), FinishedAt: metav1.Now()}}}}
	if w := ObserveWorker(pod); w.Action != contract.ActionReload || w.Result.FailedStep != contract.StepUnload || w.Entry.Config.ContainerImage != "reg/nic:1" {
		t.Errorf("observed %+v", w)
	}
}

// TestWorkerPodSeesTheNodeModulesAtHost: the node's /lib/modules is mounted read-only a second time
// at contract.HostModulesDir, where a kmod image's host link resolves in-tree dependencies (as in
// upstream KMM's worker pods), from the same volume as /lib/modules (the sandbox's in a dry run).
func TestWorkerPodSeesTheNodeModulesAtHost(t *testing.T) {
	for _, sandbox := range []string{"", "/srv/kmm-sandbox"} {
		pod, err := WorkerPod("n", WorkerPodOptions{Image: "img", DryRunSandbox: sandbox}, intent("", true))
		if err != nil {
			t.Fatal(err)
		}
		var at []string
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.Name == "lib-modules" {
				at = append(at, fmt.Sprintf("%s ro=%v", m.MountPath, m.ReadOnly))
			}
		}
		want := []string{"/lib/modules ro=true", contract.HostModulesDir + " ro=true"}
		if !slices.Equal(at, want) {
			t.Errorf("sandbox %q: the node's module tree is mounted %+v, want %+v", sandbox, at, want)
		}
	}
}
