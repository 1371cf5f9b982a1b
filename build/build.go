package build

import (
	"errors"
	"fmt"
	"path"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// Where the build pod finds its inputs.
const (
	// DockerfileKey is the key of the Dockerfile in the ConfigMap (upstream's).
	DockerfileKey = "dockerfile"
	// ContextDir is where the Dockerfile ConfigMap is mounted: the build context.
	ContextDir = "/run/kmm/build/context"
	// PullSecretDir is where the Module's pull secret is mounted (for the base images and the push).
	PullSecretDir = "/run/kmm/build/pull-secret" //nolint:gosec // G101: a mount path, not a credential
	// SecretsDir is where each of build.secrets is mounted, one directory per Secret.
	SecretsDir = "/run/kmm/build/secrets" //nolint:gosec // G101: a mount path, not a credential
	// ContainerName is the name of the build container.
	ContainerName = "build"
	// Deadline bounds a build pod (activeDeadlineSeconds): a build that hangs ends as a failure.
	Deadline = 30 * 60
)

// Request is one build: the Module's recipe resolved for one kernel and one image.
type Request struct {
	Namespace, ModuleName, PodName, Kernel, Image, BuilderImage string
	// DockerfileConfigMap names the ConfigMap holding the Dockerfile under DockerfileKey.
	DockerfileConfigMap string
	// BuildArgs are the user's; Pod adds KERNEL_VERSION, KERNEL_FULL_VERSION, MOD_NAME and
	// MOD_NAMESPACE.
	BuildArgs []kmmv1beta1.BuildArg
	// Secrets are mounted for the build.
	Secrets []corev1.LocalObjectReference
	// PullSecret is the Module's imageRepoSecret (base images and the push).
	PullSecret                            *corev1.LocalObjectReference
	BaseImageRegistryTLS, PushRegistryTLS kmmv1beta1.TLSOptions
	NodeSelector                          map[string]string
	Labels                                map[string]string
	Owner                                 metav1.OwnerReference
}

// Args are the build arguments of r: kmm's four, then the user's (a user's argument of the same
// name comes later and wins, as the last --build-arg does).
func Args(r Request) []kmmv1beta1.BuildArg {
	out := []kmmv1beta1.BuildArg{
		{Name: "KERNEL_VERSION", Value: r.Kernel},
		{Name: "KERNEL_FULL_VERSION", Value: r.Kernel},
		{Name: "MOD_NAME", Value: r.ModuleName},
		{Name: "MOD_NAMESPACE", Value: r.Namespace},
	}
	return append(out, r.BuildArgs...)
}

// Pod is the build pod of r: one container of r.BuilderImage, never restarted, bounded by
// Deadline, no API token, the Dockerfile ConfigMap as its context and the pull secret and
// build.secrets mounted; its log tail is its termination message when it fails.
func Pod(r Request) (*corev1.Pod, error) {
	switch {
	case r.BuilderImage == "":
		return nil, errors.New("build: no builder image is configured")
	case r.DockerfileConfigMap == "":
		return nil, errors.New("build: the recipe names no dockerfileConfigMap")
	case r.PodName == "" || r.Namespace == "" || r.Image == "":
		return nil, errors.New("build: the pod name, namespace and image are required")
	}
	args := []string{"--context", ContextDir, "--dockerfile", path.Join(ContextDir, DockerfileKey), "--output", r.Image}
	for _, a := range Args(r) {
		args = append(args, "--build-arg", fmt.Sprintf("%s=%s", a.Name, a.Value))
	}
	if r.PushRegistryTLS.Insecure {
		args = append(args, "--insecure-push")
	}
	vols := []corev1.Volume{{Name: "context", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: r.DockerfileConfigMap}}}}}
	mounts := []corev1.VolumeMount{{Name: "context", MountPath: ContextDir, ReadOnly: true}}
	if r.PullSecret != nil {
		vols = append(vols, secretVolume("pull-secret", r.PullSecret.Name))
		mounts = append(mounts, corev1.VolumeMount{Name: "pull-secret", MountPath: PullSecretDir, ReadOnly: true})
	}
	for i, s := range r.Secrets {
		n := fmt.Sprintf("secret-%d", i)
		vols = append(vols, secretVolume(n, s.Name))
		mounts = append(mounts, corev1.VolumeMount{Name: n, MountPath: path.Join(SecretsDir, s.Name), ReadOnly: true})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: r.PodName, Namespace: r.Namespace, Labels: r.Labels,
			OwnerReferences: []metav1.OwnerReference{r.Owner}},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:        ptr.To(int64(Deadline)),
			AutomountServiceAccountToken: ptr.To(false),
			NodeSelector:                 r.NodeSelector,
			Containers: []corev1.Container{{
				Name: ContainerName, Image: r.BuilderImage, Args: args, VolumeMounts: mounts,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: vols,
		},
	}, nil
}

func secretVolume(name, secret string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}
}
