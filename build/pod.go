package build

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// Request is one build: the Dockerfile of a ConfigMap built for one kernel and pushed as Image.
type Request struct {
	// Namespace is the Module's namespace, where the pod, the ConfigMap and the Secrets are.
	Namespace string
	// ModuleName is the Module's name (the build argument MOD_NAME).
	ModuleName string
	// PodName is the pod's name (the image controller makes it deterministic).
	PodName string
	// Kernel is the kernel release the image is built for (KERNEL_VERSION, KERNEL_FULL_VERSION).
	Kernel string
	// Image is the reference pushed.
	Image string
	// BuilderImage is kmm's builder image (an operator setting).
	BuilderImage string
	// DockerfileConfigMap names the ConfigMap holding the Dockerfile under the key "dockerfile".
	DockerfileConfigMap string
	// BuildArgs are the user's build arguments; kmm's four are added (and win over the user's).
	BuildArgs []kmmv1beta1.BuildArg
	// Secrets are mounted at /run/secrets/<name> and given to the build as BuildKit secrets
	// <name>/<key>: a RUN step mounts one with --mount=type=secret,id=<name>/<key>, at
	// /run/secrets/<key> by default (BuildKit's default target is the id's base name), at upstream's
	// /run/secrets/<name>/<key> with target=/run/secrets/<name>/<key>.
	Secrets []corev1.LocalObjectReference
	// PullSecret (a kubernetes.io/dockerconfigjson Secret) gives the push's and the base images'
	// credentials.
	PullSecret *corev1.LocalObjectReference
	// BaseImageRegistryTLS applies to the registries of the Dockerfile's FROM images,
	// PushRegistryTLS to Image's registry.
	BaseImageRegistryTLS, PushRegistryTLS kmmv1beta1.TLSOptions
	// NodeSelector chooses the nodes the build may run on (build.selector).
	NodeSelector map[string]string
	// Labels are the pod's labels.
	Labels map[string]string
	// Owner is the pod's owner (deleting it cancels the build).
	Owner metav1.OwnerReference
	// Registry are the registry settings every pod of kmm's that pulls or pushes takes (the
	// worker's: mirrors, CAs, the service account's pull secrets, credential providers), as the
	// operator defines them once (controllers/shared.RegistryOptions): cmd/builder reads the same
	// flags as the worker and turns them into buildkitd's configuration.
	Registry PodParts
}

// PodParts are arguments, container mounts and pod volumes added to the build pod.
type PodParts struct {
	Args    []string
	Mounts  []corev1.VolumeMount
	Volumes []corev1.Volume
}

// The build arguments kmm sets, as upstream KMM names them.
const (
	ArgKernelVersion     = "KERNEL_VERSION"
	ArgKernelFullVersion = "KERNEL_FULL_VERSION"
	ArgModName           = "MOD_NAME"
	ArgModNamespace      = "MOD_NAMESPACE"
)

// ContainerName is the build pod's one container.
const ContainerName = "builder"

// Deadline is the build pod's activeDeadlineSeconds: a stuck build ends as a failed pod. The
// builder's own deadline (its --timeout) is a minute shorter, so that it reports before the kill.
const Deadline = 30 * time.Minute

// Paths in the build pod.
const (
	DockerfileDir  = "/var/run/kmm/build/dockerfile"
	DockerfileName = "Dockerfile"
	PushSecretDir  = "/var/run/kmm/build/push-secret" //nolint:gosec // G101: a mount path, not a credential
	SecretsDir     = "/run/secrets"
	StateDir       = "/var/lib/buildkit"
	// DockerfileKey is the ConfigMap key of the Dockerfile.
	DockerfileKey = "dockerfile"
)

// The flags of cmd/builder that Pod passes.
const (
	FlagDockerfileDir  = "--dockerfile-dir"
	FlagImage          = "--image"
	FlagBuildArg       = "--build-arg"
	FlagDockerConfig   = "--docker-config"
	FlagSecretsDir     = "--secrets-dir" //nolint:gosec // G101: a flag name, not a credential
	FlagStateDir       = "--state-dir"
	FlagTimeout        = "--timeout"
	FlagBaseInsecure   = "--base-insecure"
	FlagBaseSkipVerify = "--base-skip-verify"
	FlagPushInsecure   = "--push-insecure"
	FlagPushSkipVerify = "--push-skip-verify"
	FlagUnprivileged   = "--unprivileged"
)

// resources: requests for scheduling, no CPU limit (a compile uses what the node gives), a memory
// limit that bounds a runaway build on the node.
var resources = corev1.ResourceRequirements{
	Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
	Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")},
}

// Pod returns the build pod of r, or why r cannot be built.
func Pod(r Request) (*corev1.Pod, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:            r.PodName,
			Namespace:       r.Namespace,
			Labels:          copyMap(r.Labels),
			OwnerReferences: []metav1.OwnerReference{r.Owner},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:        ptr.To(int64(Deadline.Seconds())),
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			NodeSelector:                 copyMap(r.NodeSelector),
			Containers: []corev1.Container{{
				Name:                     ContainerName,
				Image:                    r.BuilderImage,
				Args:                     r.args(),
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				SecurityContext:          securityContext(),
				Resources:                resources,
				VolumeMounts:             r.mounts(),
			}},
			Volumes: r.volumes(),
		},
	}, nil
}

func (r Request) check() error {
	var errs []error
	for _, f := range []struct{ name, value string }{
		{"namespace", r.Namespace}, {"module name", r.ModuleName}, {"pod name", r.PodName},
		{"kernel", r.Kernel}, {"image", r.Image}, {"builder image", r.BuilderImage},
		{"Dockerfile ConfigMap", r.DockerfileConfigMap},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("no %s", f.name))
		}
	}
	for _, a := range r.BuildArgs {
		if a.Name == "" || strings.ContainsAny(a.Name, "= \t\n") {
			errs = append(errs, fmt.Errorf("invalid build argument name %q", a.Name))
		}
	}
	if r.PullSecret != nil && r.PullSecret.Name == "" {
		errs = append(errs, errors.New("pull secret without a name"))
	}
	for _, s := range r.Secrets {
		if s.Name == "" {
			errs = append(errs, errors.New("build secret without a name"))
		}
	}
	if r.Owner.UID == "" || r.Owner.Name == "" {
		errs = append(errs, errors.New("no owner"))
	}
	return errors.Join(errs...)
}

// BuildArgsWithKMM returns the build arguments of r in order: the user's (without the names kmm sets),
// then kmm's four.
func (r Request) BuildArgsWithKMM() []kmmv1beta1.BuildArg {
	kmm := []kmmv1beta1.BuildArg{
		{Name: ArgKernelVersion, Value: r.Kernel},
		{Name: ArgKernelFullVersion, Value: r.Kernel},
		{Name: ArgModName, Value: r.ModuleName},
		{Name: ArgModNamespace, Value: r.Namespace},
	}
	out := make([]kmmv1beta1.BuildArg, 0, len(r.BuildArgs)+len(kmm))
	for _, a := range r.BuildArgs {
		if !reserved(a.Name) {
			out = append(out, a)
		}
	}
	return append(out, kmm...)
}

func reserved(name string) bool {
	switch name {
	case ArgKernelVersion, ArgKernelFullVersion, ArgModName, ArgModNamespace:
		return true
	}
	return false
}

func (r Request) args() []string {
	args := []string{FlagDockerfileDir, DockerfileDir, FlagImage, r.Image, FlagStateDir, StateDir,
		FlagTimeout, (Deadline - time.Minute).String(), FlagUnprivileged}
	for _, a := range r.BuildArgsWithKMM() {
		args = append(args, FlagBuildArg, a.Name+"="+a.Value)
	}
	args = append(args, r.Registry.Args...)
	if r.PullSecret != nil {
		args = append(args, FlagDockerConfig, PushSecretDir)
	}
	if len(r.Secrets) > 0 {
		args = append(args, FlagSecretsDir, SecretsDir)
	}
	for _, f := range []struct {
		on   bool
		flag string
	}{
		{r.BaseImageRegistryTLS.Insecure, FlagBaseInsecure},
		{r.BaseImageRegistryTLS.InsecureSkipTLSVerify, FlagBaseSkipVerify},
		{r.PushRegistryTLS.Insecure, FlagPushInsecure},
		{r.PushRegistryTLS.InsecureSkipTLSVerify, FlagPushSkipVerify},
	} {
		if f.on {
			args = append(args, f.flag)
		}
	}
	return args
}

func (r Request) mounts() []corev1.VolumeMount {
	m := []corev1.VolumeMount{
		{Name: "dockerfile", MountPath: DockerfileDir, ReadOnly: true},
		{Name: "state", MountPath: StateDir},
		{Name: "tmp", MountPath: "/tmp"},
	}
	if r.PullSecret != nil {
		m = append(m, corev1.VolumeMount{Name: "push-secret", MountPath: PushSecretDir, ReadOnly: true})
	}
	for i, s := range r.Secrets {
		m = append(m, corev1.VolumeMount{Name: secretVolume(i), MountPath: path.Join(SecretsDir, s.Name), ReadOnly: true})
	}
	return append(m, r.Registry.Mounts...)
}

func (r Request) volumes() []corev1.Volume {
	v := []corev1.Volume{
		{Name: "dockerfile", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: r.DockerfileConfigMap},
			Items:                []corev1.KeyToPath{{Key: DockerfileKey, Path: DockerfileName}},
		}}},
		{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if r.PullSecret != nil {
		v = append(v, corev1.Volume{Name: "push-secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: r.PullSecret.Name,
			Items:      []corev1.KeyToPath{{Key: corev1.DockerConfigJsonKey, Path: "config.json"}},
		}}})
	}
	for i, s := range r.Secrets {
		v = append(v, corev1.Volume{Name: secretVolume(i), VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: s.Name}}})
	}
	return append(v, r.Registry.Volumes...)
}

func secretVolume(i int) string { return "secret-" + strconv.Itoa(i) }

func copyMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// securityContext is the least the build pod needs on a real node (docs/install.md "Security"):
// root with CAP_SYS_ADMIN, so that runc can make the namespaces and mounts of each RUN step and
// BuildKit can mount overlayfs, under the runtime's default seccomp profile, not privileged. The
// builder is told (FlagUnprivileged) to run runc without cgroups of its own (the pod's are
// read-only), without a session keyring and without pivot_root(2) (both refused by that profile).
func securityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsUser:      ptr.To(int64(0)),
		Capabilities:   &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}
