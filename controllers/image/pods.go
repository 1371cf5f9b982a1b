package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// The labels of build and sign pods (beside contract.LabelManagedBy and the Module's two).
const (
	// LabelImageJob is the pod's kind: "build" or "sign".
	LabelImageJob = "kmm.sigs.x-k8s.io/image-job"
	// LabelImageHash is the first 16 hex digits of the SHA-256 of the image the pod makes.
	LabelImageHash = "kmm.sigs.x-k8s.io/image-hash"
	// LabelImageRun is the image machine's run the pod was created for.
	LabelImageRun = "kmm.sigs.x-k8s.io/image-run"
)

// Where the sign pod finds what the worker's sign subcommand reads.
const (
	pullSecretDir = "/var/run/kmm/pull-secret" //nolint:gosec // G101: a mount path, not a credential
	// SignPodDeadline bounds a sign pod: the worker's own timeout plus a margin, so that the
	// worker reports a timed-out result itself first.
	SignPodDeadline = contract.DefaultSignTimeout + 2*60e9
	// maxPodMessage bounds the failure message taken from a pod (the kubelet's own bound on a
	// termination message is 4 KiB).
	maxPodMessage = 2048
)

// imageHash names an image in labels and pod names.
func imageHash(img string) string {
	sum := sha256.Sum256([]byte(img))
	return hex.EncodeToString(sum[:8])
}

// PodName is the deterministic name of the build or sign pod of a Module's image for one run: the
// API server refuses a second pod of the same name, a fence beside the machine's one pod at a time.
func PodName(module string, kind image.PodKind, img string, run int32) string {
	return contract.Bounded(fmt.Sprintf("%s-%s-%s-%d", module, kind, imageHash(img)[:10], run), contract.MaxLabelValue)
}

// podLabels are the labels of a build or sign pod.
func podLabels(m *kmmv1beta1.Module, kind image.PodKind, img string, run int32) map[string]string {
	return map[string]string{
		contract.LabelManagedBy:       contract.ManagedBy,
		contract.LabelModuleNamespace: m.Namespace,
		contract.LabelModuleName:      contract.Bounded(m.Name, contract.MaxLabelValue),
		LabelImageJob:                 string(kind),
		LabelImageHash:                imageHash(img),
		LabelImageRun:                 strconv.Itoa(int(run)),
	}
}

// owner is the Module as the controlling owner of its build and sign pods: the garbage collector
// deletes them with it.
func owner(m *kmmv1beta1.Module) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: kmmv1beta1.GroupVersion.String(), Kind: "Module", Name: m.Name, UID: m.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
}

// UnsignedImage is where the build of an image that is signed afterwards pushes its output:
// upstream's name, the tag suffixed with -<namespace>_<module>_kmm_unsigned.
func UnsignedImage(m *kmmv1beta1.Module, img string) string {
	suffix := "-" + m.Namespace + "_" + m.Name + "_kmm_unsigned"
	slash := strings.LastIndex(img, "/")
	if colon := strings.LastIndex(img, ":"); colon > slash {
		return img + suffix
	}
	return img + ":latest" + suffix
}

// signSource is the image a sign pod reads: the build's output when the entry builds, else the
// sign's unsignedImage for the entry's kernel.
func signSource(m *kmmv1beta1.Module, e *kmmv1beta1.ModuleImageSpec) (string, error) {
	if e.Build != nil {
		return UnsignedImage(m, e.Image), nil
	}
	return mapping.Expand(m, e.KernelVersion, e.Sign.UnsignedImage)
}

// buildRequest is the build of entry e for run.
func buildRequest(m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec, run int32, builderImage string, reg shared.RegistryPod) build.Request {
	target := e.Image
	if e.Sign != nil {
		target = UnsignedImage(m, e.Image)
	}
	r := build.Request{
		Namespace: m.Namespace, ModuleName: m.Name, PodName: PodName(m.Name, image.BuildPod, e.Image, run),
		Kernel: e.KernelVersion, Image: target, BuilderImage: builderImage,
		DockerfileConfigMap:  e.Build.DockerfileConfigMap.Name,
		BuildArgs:            e.Build.BuildArgs,
		Secrets:              e.Build.Secrets,
		PullSecret:           mic.Spec.ImageRepoSecret,
		BaseImageRegistryTLS: e.Build.BaseImageRegistryTLS,
		NodeSelector:         e.Build.Selector,
		Labels:               podLabels(m, image.BuildPod, e.Image, run),
		Owner:                owner(m),
		Registry:             build.PodParts{Args: reg.Args, Mounts: reg.Mounts, Volumes: reg.Volumes},
	}
	if e.RegistryTLS != nil {
		r.PushRegistryTLS = *e.RegistryTLS
	}
	return r
}

// signPod is the sign pod of entry e for run: kmm's worker image running `worker sign`, the key and
// certificate Secrets and the pull secret mounted, its config through the downward API, and the
// registry settings of every worker pod (reg): `worker sign` reads the same flags as load.
func signPod(m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec, run int32, workerImage string, reg shared.RegistryPod) (*corev1.Pod, error) {
	src, err := signSource(m, e)
	if err != nil {
		return nil, err
	}
	cfg := contract.SignConfig{Namespace: m.Namespace, Name: m.Name, Kernel: e.KernelVersion, UnsignedImage: src,
		UnsignedImageRegistryTLS: e.Sign.UnsignedImageRegistryTLS, Image: e.Image}
	if e.RegistryTLS != nil {
		cfg.RegistryTLS = *e.RegistryTLS
		if e.Build != nil {
			// The build pushed the unsigned image with these options (buildRequest): read it so.
			cfg.UnsignedImageRegistryTLS.Insecure = cfg.UnsignedImageRegistryTLS.Insecure || e.RegistryTLS.Insecure
			cfg.UnsignedImageRegistryTLS.InsecureSkipTLSVerify = cfg.UnsignedImageRegistryTLS.InsecureSkipTLSVerify || e.RegistryTLS.InsecureSkipTLSVerify
		}
	}
	for _, f := range e.Sign.FilesToSign {
		x, err := mapping.Expand(m, e.KernelVersion, f)
		if err != nil {
			return nil, err
		}
		cfg.FilesToSign = append(cfg.FilesToSign, x)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	args := []string{"sign", "--config", contract.ConfigFile}
	vols := []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path: path.Base(contract.ConfigFile), FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + contract.AnnotationConfig + "']"}}}}}},
		keyVolume("key", e.Sign.KeySecret.Name, "key"),
		keyVolume("cert", e.Sign.CertSecret.Name, "cert"),
	}
	mounts := []corev1.VolumeMount{
		{Name: "config", MountPath: path.Dir(contract.ConfigFile), ReadOnly: true},
		{Name: "key", MountPath: path.Dir(contract.SignKeyFile), ReadOnly: true},
		{Name: "cert", MountPath: path.Dir(contract.SignCertFile), ReadOnly: true},
	}
	if ps := mic.Spec.ImageRepoSecret; ps != nil {
		args = append(args, "--pull-secret", path.Join(pullSecretDir, corev1.DockerConfigJsonKey))
		vols = append(vols, keyVolume("pull-secret", ps.Name, corev1.DockerConfigJsonKey))
		mounts = append(mounts, corev1.VolumeMount{Name: "pull-secret", MountPath: pullSecretDir, ReadOnly: true})
	}
	args, vols, mounts = append(args, reg.Args...), append(vols, reg.Volumes...), append(mounts, reg.Mounts...)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: PodName(m.Name, image.SignPod, e.Image, run), Namespace: m.Namespace,
			Labels: podLabels(m, image.SignPod, e.Image, run), Annotations: map[string]string{contract.AnnotationConfig: string(data)},
			OwnerReferences: []metav1.OwnerReference{owner(m)}},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:        ptr.To(int64(SignPodDeadline.Seconds())),
			AutomountServiceAccountToken: ptr.To(false),
			Tolerations:                  mic.Spec.Tolerations,
			Containers: []corev1.Container{{
				Name: contract.ContainerName, Image: workerImage, Args: args, VolumeMounts: mounts,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(65532)),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, ReadOnlyRootFilesystem: ptr.To(true)},
			}},
			Volumes: vols,
		},
	}, nil
}

// keyVolume mounts one key of a Secret as a file of the same name.
func keyVolume(name, secret, key string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret,
		Items: []corev1.KeyToPath{{Key: key, Path: key}}}}}
}

// podFact is what the image machine needs of a build or sign pod: its run, its phase and, failed,
// why (the sign worker's result, the build's log tail, or the kubelet's reason).
func podFact(p *corev1.Pod) (image.Pod, bool) {
	run, err := strconv.ParseInt(p.Labels[LabelImageRun], 10, 32)
	if err != nil {
		return image.Pod{}, false
	}
	f := image.Pod{Run: int32(run), Phase: image.PodRunning}
	switch p.Status.Phase {
	case corev1.PodSucceeded:
		f.Phase = image.PodSucceeded
	case corev1.PodFailed:
		f.Phase, f.Message = image.PodFailed, failureMessage(p)
	}
	return f, true
}

// failureMessage says why a pod failed: the worker's result (reason: message), the builder's
// (its message, then the tail of the build log), or the container's termination message (the
// kubelet's log tail of a container that wrote none), else the pod's own reason (DeadlineExceeded, Evicted).
func failureMessage(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		t := cs.State.Terminated
		if t == nil {
			continue
		}
		if res, err := contract.ParseResult([]byte(t.Message)); err == nil && res.Outcome == contract.OutcomeFailed {
			return tail(fmt.Sprintf("%s: %s", res.Reason, res.Message))
		}
		if res, err := build.ParseResult([]byte(t.Message)); err == nil && res.Message != "" {
			return tail(strings.TrimSpace(res.Message + "\n" + res.Log))
		}
		if msg := strings.TrimSpace(t.Message); msg != "" {
			return tail(msg)
		}
		return fmt.Sprintf("container %s exited with code %d (%s)", cs.Name, t.ExitCode, t.Reason)
	}
	if p.Status.Reason != "" || p.Status.Message != "" {
		return tail(strings.TrimSpace(p.Status.Reason + ": " + p.Status.Message))
	}
	return "the pod failed"
}

// tail is the last maxPodMessage bytes of s.
func tail(s string) string {
	if len(s) <= maxPodMessage {
		return s
	}
	return "…" + s[len(s)-maxPodMessage:]
}
