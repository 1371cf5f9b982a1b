package node

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

// Host paths the worker pod mounts.
const (
	// CacheHostPath keeps pulled kmod images across pods (and reboots).
	CacheHostPath = "/var/lib/kmm/cache"
	// FirmwareHostPath is where firmware is installed on the node unless WorkerPodOptions says
	// otherwise.
	FirmwareHostPath = contract.DefaultFirmwareHostPath
	pullSecretDir    = "/var/run/kmm/pull-secret" //nolint:gosec // G101: a mount path, not a credential
	// SandboxMountPath is where a dry-run worker pod sees its sandbox (WorkerPodOptions.DryRunSandbox).
	SandboxMountPath = "/var/lib/kmm/sandbox"
	// bootIDPath is the kernel's boot ID, as the kubelet reports it in node.status.nodeInfo.bootID.
	bootIDPath = "/proc/sys/kernel/random/boot_id"
	// FirmwareClassParameters holds the firmware class path the worker writes. A privileged
	// container on the pod network gets /sys read-only from containerd (1.6 and 1.7: the sysfs of
	// another network namespace cannot be mounted read-write; measured on the e2e-kernel guest,
	// "open /sys/module/firmware_class/parameters/path: read-only file system"), so the worker pod
	// mounts this directory from the host, read-write, where the worker writes it.
	FirmwareClassParameters = "/sys/module/firmware_class/parameters"
)

// WorkerPodOptions are the operator's settings of every worker pod.
type WorkerPodOptions struct {
	// Image is the worker image.
	Image string
	// DryRunSandbox, when set, is a host directory that stands for the node's root: the worker runs
	// `modprobe -n` (--dry-run --host-root) against it instead of loading anything, and every host
	// path the pod would use (the image cache, /lib/modules, the firmware directory, sysfs) is
	// below it. Only the node's boot ID is the real one, mounted read-only into the sandbox, so
	// that a load is recorded against the boot it happened in. It is for hosts whose kernel cannot
	// load modules (demos, CI): the pod spec is otherwise the one a real node runs.
	DryRunSandbox string
	// FirmwareHostPath is the node directory firmware is copied to ("" → FirmwareHostPath,
	// /var/lib/firmware, writable on image-based OSes; upstream KMM installs to /lib/firmware, a
	// kernel default search path).
	FirmwareHostPath string
	// LeaveFirmwareClassPath keeps the worker from writing FirmwareHostPath to
	// /sys/module/firmware_class/parameters/path (needed unless the directory is one the kernel
	// searches by default, such as /lib/firmware).
	LeaveFirmwareClassPath bool
	// Registry is the registry configuration worker pods pull with (mirrors, CAs, credential providers).
	Registry WorkerRegistryOptions
	// ServiceAccountPullSecrets are the imagePullSecrets of the pod's service account: the worker
	// tries them after imageRepoSecret, as the kubelet does for a pod's images.
	ServiceAccountPullSecrets []string
}

// firmwareHostPath is the node directory firmware goes to.
func (o WorkerPodOptions) firmwareHostPath() string {
	if o.FirmwareHostPath == "" {
		return FirmwareHostPath
	}
	return o.FirmwareHostPath
}

// WorkerPodName is the deterministic name of a pair's worker pod: at most one exists per pair
// because the API server refuses a second pod of the same name.
func WorkerPodName(node, namespace, name string) string {
	return contract.Bounded(fmt.Sprintf("kmm-worker-%s-%s-%s", node, namespace, name), 253)
}

// WorkerPod builds the worker pod for an intent on a node (SPEC §6): bound to the node, never
// restarted, no API token, SYS_MODULE, privileged only with firmware, config through the downward API.
func WorkerPod(node string, o WorkerPodOptions, in *fsm.WorkerIntent) (*corev1.Pod, error) {
	e := &in.Entry
	cfg := contract.Config{Namespace: e.Namespace, Name: e.Name, Config: e.Config, Previous: in.Previous}
	// A reload removes the previous config's firmware and installs the new one's.
	firmware := e.Config.Modprobe.FirmwarePath != "" || (in.Previous != nil && in.Previous.Modprobe.FirmwarePath != "")
	if firmware {
		cfg.SetFirmwareClassPath, cfg.FirmwareHostPath = !o.LeaveFirmwareClassPath, o.firmwareHostPath()
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding the worker config: %w", err)
	}
	args := []string{string(in.Action), "--config", contract.ConfigFile, "--cache-dir", CacheHostPath,
		"--timeout", contract.DefaultTimeout.String()}
	if e.ImageRepoSecret != nil {
		args = append(args, "--pull-secret", path.Join(pullSecretDir, corev1.DockerConfigJsonKey))
	}
	reg := o.Registry.Pod(o.ServiceAccountPullSecrets)
	args = append(args, reg.Args...)
	if o.DryRunSandbox != "" {
		args = append(args, "--dry-run", "--host-root", SandboxMountPath)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        WorkerPodName(node, e.Namespace, e.Name),
			Namespace:   e.Namespace,
			Labels:      workerLabels(node, e, in.Action),
			Annotations: map[string]string{contract.AnnotationConfig: string(data), contract.AnnotationAttempt: strconv.Itoa(int(in.Attempt))},
		},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			RestartPolicy:                corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:        ptr.To(int64(WorkerPodDeadline.Seconds())),
			AutomountServiceAccountToken: ptr.To(false),
			ServiceAccountName:           e.ServiceAccountName,
			Tolerations:                  e.Tolerations,
			// Critical, as the device plugin: the kubelet admits a critical pod on a node under disk
			// or PID pressure (and evicts it last), so that node-pressure never blocks a load or an
			// unload. The pressure taints are NoSchedule, which a pod bound with nodeName never meets.
			PriorityClassName: WorkerPriorityClass,
			Containers: []corev1.Container{{
				Name:                     contract.ContainerName,
				Image:                    o.Image,
				Args:                     args,
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext:          workerSecurityContext(firmware),
				Resources:                workerResources,
				VolumeMounts:             append(workerMounts(e, firmware, o.DryRunSandbox != "", o.firmwareHostPath(), cfg.SetFirmwareClassPath), reg.Mounts...),
			}},
			Volumes: append(workerVolumes(e, firmware, o.DryRunSandbox, o.firmwareHostPath(), cfg.SetFirmwareClassPath), reg.Volumes...),
		},
	}
	addHook(pod, node, in, o.DryRunSandbox)
	return pod, nil
}

// WorkerPriorityClass is the priority class of worker pods (and of device plugin pods).
const WorkerPriorityClass = "system-node-critical"

// WorkerPodDeadline is the worker pod's activeDeadlineSeconds: the worker's own deadline
// (contract.DefaultTimeout, passed as --timeout) plus a minute to start, write its result and exit.
// The NMC decision fails a pod still there after fsm.DefaultWorkerTimeout.
const WorkerPodDeadline = contract.DefaultTimeout + time.Minute

// workerResources bound the worker container: it streams the image (peak RSS measured at 13-19
// MiB, see docs/worker-limits.md); the limit leaves room for modprobe and the page cache of the
// files it extracts, which the kernel charges to the pod.
var workerResources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
	Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
}

// workerSecurityContext grants the worker only what it needs: CAP_SYS_MODULE to load and unload,
// root to read the host's module tree, the runtime's default seccomp profile (which allows the
// module system calls to holders of CAP_SYS_MODULE), a read-only root file system, and no
// privilege escalation. Privileged only with firmware (it writes the firmware class path in sysfs),
// where the API server forbids allowPrivilegeEscalation: false.
func workerSecurityContext(firmware bool) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{
		Privileged:             ptr.To(firmware),
		Capabilities:           &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SYS_MODULE"}},
		RunAsUser:              ptr.To(int64(0)),
		ReadOnlyRootFilesystem: ptr.To(true),
		SeccompProfile:         &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	if !firmware {
		sc.AllowPrivilegeEscalation = ptr.To(false)
	}
	return sc
}

func workerLabels(node string, e *kmmv1beta1.NodeModuleSpec, action contract.Action) map[string]string {
	return map[string]string{
		contract.LabelManagedBy:       contract.ManagedBy,
		contract.LabelWorker:          "true",
		contract.LabelNode:            contract.Bounded(node, contract.MaxLabelValue),
		contract.LabelModuleNamespace: e.Namespace,
		contract.LabelModuleName:      e.Name,
		contract.LabelAction:          string(action),
	}
}

func workerMounts(e *kmmv1beta1.NodeModuleSpec, firmware, sandbox bool, firmwareDir string, classPath bool) []corev1.VolumeMount {
	m := []corev1.VolumeMount{
		{Name: "config", MountPath: path.Dir(contract.ConfigFile), ReadOnly: true},
		{Name: "cache", MountPath: CacheHostPath},
		{Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true},
		// Again where a kmod image's host link resolves in-tree dependencies (docs/api.md).
		{Name: "lib-modules", MountPath: contract.HostModulesDir, ReadOnly: true},
		{Name: "tmp", MountPath: "/tmp"},
	}
	if e.ImageRepoSecret != nil {
		m = append(m, corev1.VolumeMount{Name: "pull-secret", MountPath: pullSecretDir, ReadOnly: true})
	}
	switch {
	case sandbox:
		// The worker writes firmware and the firmware class path below --host-root. The boot ID
		// is mounted over the sandbox's own path (containerd mounts the deeper path second).
		m = append(m, corev1.VolumeMount{Name: "sandbox", MountPath: SandboxMountPath},
			corev1.VolumeMount{Name: "boot-id", MountPath: path.Join(SandboxMountPath, bootIDPath), ReadOnly: true})
	case firmware:
		m = append(m, corev1.VolumeMount{Name: "firmware", MountPath: firmwareDir})
		if classPath {
			m = append(m, corev1.VolumeMount{Name: "firmware-class", MountPath: FirmwareClassParameters})
		}
	}
	return m
}

func workerVolumes(e *kmmv1beta1.NodeModuleSpec, firmware bool, sandbox, firmwareDir string, classPath bool) []corev1.Volume {
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	// hostDir is a host directory of the node, or of the sandbox standing for it.
	hostDir := func(p string) string { return path.Join(sandbox, p) }
	var modulesType *corev1.HostPathType // the node's own tree: never created
	if sandbox != "" {
		modulesType = &dirOrCreate
	}
	v := []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path:     path.Base(contract.ConfigFile),
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + contract.AnnotationConfig + "']"},
		}}}}},
		{Name: "cache", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir(CacheHostPath), Type: &dirOrCreate}}},
		{Name: "lib-modules", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: hostDir("/lib/modules"), Type: modulesType}}},
		// The root file system is read-only; modprobe's softdep config goes here.
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("16Mi"))}}},
	}
	if e.ImageRepoSecret != nil {
		v = append(v, corev1.Volume{Name: "pull-secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: e.ImageRepoSecret.Name}}})
	}
	switch {
	case sandbox != "":
		file := corev1.HostPathFile
		v = append(v,
			corev1.Volume{Name: "sandbox", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: sandbox, Type: &dirOrCreate}}},
			corev1.Volume{Name: "boot-id", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: bootIDPath, Type: &file}}})
	case firmware:
		v = append(v, corev1.Volume{Name: "firmware", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: firmwareDir, Type: &dirOrCreate}}})
		if classPath {
			dir := corev1.HostPathDirectory
			v = append(v, corev1.Volume{Name: "firmware-class", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: FirmwareClassParameters, Type: &dir}}})
		}
	}
	return v
}

// ObserveWorker turns a worker pod into the facts the NMC decision reads. It is the one place a
// finished pod's termination message is parsed: the reconciler's metrics use the Result it returns.
func ObserveWorker(pod *corev1.Pod) fsm.Worker {
	w := fsm.Worker{Action: contract.Action(pod.Labels[contract.LabelAction]), Created: pod.CreationTimestamp.Time}
	if a, err := strconv.Atoi(pod.Annotations[contract.AnnotationAttempt]); err == nil {
		w.Attempt = int32(a) //nolint:gosec // G109: the attempt annotation is written by the operator and small
	}
	// Decoded, not validated: the operator wrote it, and a config the worker refused must still be
	// known as the one that failed (else every failure looked like a changed spec: a retry storm).
	var cfg contract.Config
	if err := json.Unmarshal([]byte(pod.Annotations[contract.AnnotationConfig]), &cfg); err == nil {
		w.EntryKnown = true
		w.Entry = kmmv1beta1.NodeModuleSpec{Namespace: cfg.Namespace, Name: cfg.Name, Config: cfg.Config,
			ServiceAccountName: pod.Spec.ServiceAccountName, Tolerations: pod.Spec.Tolerations}
		if v := pullSecretVolume(pod); v != "" {
			w.Entry.ImageRepoSecret = &corev1.LocalObjectReference{Name: v}
		}
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		w.Phase = fsm.PodSucceeded
	case corev1.PodFailed:
		w.Phase = fsm.PodFailed
	default:
		w.Phase = fsm.PodRunning
	}
	if w.Phase != fsm.PodRunning {
		w.Result = workerResult(pod)
	}
	return w
}

func pullSecretVolume(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == "pull-secret" && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// workerResult reads the worker's report from the termination message; a failed pod whose hook
// failed is the hook's failure (hookFailure); a pod that ended without a report (evicted, killed)
// is a failure of class Other with the pod's own reason.
func workerResult(pod *corev1.Pod) contract.Result {
	r := workerReport(pod)
	if pod.Status.Phase == corev1.PodFailed {
		if h, ok := hookFailure(pod, r); ok {
			return h
		}
	}
	return r
}

// workerReport is the worker container's own report.
func workerReport(pod *corev1.Pod) contract.Result {
	if cs, ok := containerStatus(pod, contract.ContainerName); ok && cs.State.Terminated != nil {
		if r, err := contract.ParseResult([]byte(cs.State.Terminated.Message)); err == nil {
			return r
		}
	}
	msg := pod.Status.Message
	if msg == "" {
		msg = "the worker pod ended without a result"
	}
	if pod.Status.Phase == corev1.PodSucceeded {
		return contract.Result{}
	}
	return contract.Result{Reason: contract.ReasonOther, Message: pod.Status.Reason + " " + msg}
}

// workerDuration is how long a finished worker pod ran.
func workerDuration(pod *corev1.Pod) (time.Duration, bool) {
	if cs, ok := containerStatus(pod, contract.ContainerName); ok {
		if t := cs.State.Terminated; t != nil && !t.FinishedAt.IsZero() {
			return t.FinishedAt.Sub(pod.CreationTimestamp.Time), true
		}
	}
	return 0, false
}
