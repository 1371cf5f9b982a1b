package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
)

// Upstream KMM's in-cluster build and signing recipe, accepted unchanged (field names, JSON tags and
// required fields as upstream's v1beta1 Module has them). The bounds below are kmm's: every outside
// input has one, and docs/api.md lists them.

// The bounds of a build or sign recipe.
const (
	// MaxBuildArgs bounds build.buildArgs.
	MaxBuildArgs = 64
	// MaxBuildSecrets bounds build.secrets.
	MaxBuildSecrets = 16
	// MaxBuildSelectorLabels bounds build.selector.
	MaxBuildSelectorLabels = 32
	// MaxFilesToSign bounds sign.filesToSign (the sign package's own limit, sign.MaxPatterns).
	MaxFilesToSign = 64
)

// BuildArg is one build argument given to the Dockerfile (an ARG). kmm adds KERNEL_VERSION,
// KERNEL_FULL_VERSION, MOD_NAME and MOD_NAMESPACE itself, as upstream does.
type BuildArg struct {
	// Name of the argument.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// Value of the argument.
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value"`
}

// KanikoParams is upstream's tuning of its Kaniko builder. kmm builds with BuildKit: the field is
// accepted so that upstream's Modules apply, and has no effect.
type KanikoParams struct {
	// Tag of upstream's Kaniko image. Ignored by kmm.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Tag string `json:"tag,omitempty"`
}

// Build is how to build the kmod image in the cluster when it does not exist: a Dockerfile from a
// ConfigMap, built for the node's kernel and pushed under the mapping's containerImage (or, with
// Sign, as the unsigned image that is then signed). A mapping's Build overrides the container's.
type Build struct {
	// BuildArgs are the Dockerfile's build arguments, in addition to the ones kmm sets.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	BuildArgs []BuildArg `json:"buildArgs,omitempty"`

	// DockerfileConfigMap names the ConfigMap, in the Module's namespace, holding the Dockerfile
	// under the key "dockerfile".
	DockerfileConfigMap *corev1.LocalObjectReference `json:"dockerfileConfigMap"`

	// BaseImageRegistryTLS says how to reach the registries of the Dockerfile's base images.
	// +optional
	BaseImageRegistryTLS TLSOptions `json:"baseImageRegistryTLS,omitempty"`

	// Secrets, in the Module's namespace, are made available to the build (for private sources; the
	// registry credentials come from spec.imageRepoSecret).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Secrets []corev1.LocalObjectReference `json:"secrets,omitempty"`

	// KanikoParams is upstream's Kaniko tuning; accepted and ignored (kmm builds with BuildKit).
	// +optional
	KanikoParams *KanikoParams `json:"kanikoParams,omitempty"`

	// Selector chooses the nodes the build pod may run on.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	Selector map[string]string `json:"selector,omitempty"`
}

// Sign is how to sign the kernel modules of the kmod image in the cluster (Secure Boot): each file
// of FilesToSign gets a module signature made with the key and certificate of the two Secrets, and
// the signed image is pushed under the mapping's containerImage.
type Sign struct {
	// UnsignedImage is the image whose modules are signed; ignored when a Build is present (the
	// build's output is signed), required otherwise. It may use the same variables as
	// containerImage.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	UnsignedImage string `json:"unsignedImage,omitempty"`

	// UnsignedImageRegistryTLS says how to reach the registry of UnsignedImage.
	// +optional
	UnsignedImageRegistryTLS TLSOptions `json:"unsignedImageRegistryTLS,omitempty"`

	// KeySecret names the Secret holding the private key (under the key "key").
	KeySecret *corev1.LocalObjectReference `json:"keySecret"`

	// CertSecret names the Secret holding the certificate (under the key "cert").
	CertSecret *corev1.LocalObjectReference `json:"certSecret"`

	// FilesToSign are absolute paths, or globs (*, ?, [...]) within one path element, of the
	// modules to sign, under modprobe.dirName. At least one, at most 64.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=1024
	FilesToSign []string `json:"filesToSign,omitempty"`
}
