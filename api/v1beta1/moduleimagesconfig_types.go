package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModuleImagesConfig (MIC) is upstream KMM's internal record of the images one Module's nodes need,
// one object per Module, named after it, in its namespace. kmm's schema is a superset of
// upstream's, so that an object upstream wrote stays readable after a switch: the spec and
// imagesStates[].image/status are upstream's; the rest of each status entry (state, reason,
// message, attempts, run, transitions, …) is the record of kmm's per-image state machine
// (package image, docs/build.md).

// ImageState is upstream's summary of an image (status.imagesStates[].status).
type ImageState string

// Upstream's image summaries. kmm writes the one its machine state stands for (UpstreamStatus in
// package image).
const (
	// ImageExists: the image is in its registry.
	ImageExists ImageState = "Exists"
	// ImageDoesNotExist: the image is not, and there is nothing to build or sign it with.
	ImageDoesNotExist ImageState = "DoesNotExist"
	// ImageNeedsBuilding: the image is not, and is being built.
	ImageNeedsBuilding ImageState = "NeedsBuilding"
	// ImageNeedsSigning: the image is not, and its modules are being signed.
	ImageNeedsSigning ImageState = "NeedsSigning"
)

// ImageMachineState is the state of one (Module, image) in kmm's image state machine.
type ImageMachineState string

// The states of the image machine (package image describes each; docs/state-diagrams/image.md).
const (
	ImageChecking     ImageMachineState = "Checking"
	ImagePresent      ImageMachineState = "Present"
	ImageMissing      ImageMachineState = "Missing"
	ImageBuilding     ImageMachineState = "Building"
	ImageSigning      ImageMachineState = "Signing"
	ImageBuildBackOff ImageMachineState = "BuildBackOff"
	ImageSignBackOff  ImageMachineState = "SignBackOff"
)

// The bounds of a ModuleImagesConfig.
const (
	// MaxMICImages bounds spec.images and status.imagesStates: one image per kernel the Module's
	// nodes run.
	MaxMICImages = 256
	// MaxImageTransitions bounds an image's transition log.
	MaxImageTransitions = 16
)

// ModuleImageSpec is one image the Module's nodes need and how to make it if it is missing.
type ModuleImageSpec struct {
	// Image is the kmod image, variables substituted.
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`

	// KernelVersion is the kernel the image is for.
	// +kubebuilder:validation:MaxLength=256
	KernelVersion string `json:"kernelVersion"`

	// Build is the build recipe (the mapping's over the container's), if the image may be built.
	// +optional
	Build *Build `json:"build,omitempty"`

	// Sign is the sign recipe, if the image's modules are signed in the cluster.
	// +optional
	Sign *Sign `json:"sign,omitempty"`

	// SkipWaitMissingImage reports an image without a recipe as DoesNotExist at once instead of
	// waiting for it to appear (upstream's field).
	// +optional
	SkipWaitMissingImage bool `json:"skipWaitMissingImage,omitempty"`

	// RegistryTLS says how to reach the image's registry.
	// +optional
	RegistryTLS *TLSOptions `json:"registryTLS,omitempty"`

	// DirName is the directory of the modules inside the image (modprobe.dirName), for signing.
	// +optional
	// +kubebuilder:default=/opt
	// +kubebuilder:validation:MaxLength=256
	DirName string `json:"dirName,omitempty"`
}

// ModuleImagesConfigSpec is the images of one Module. Written by the Module side only.
type ModuleImagesConfigSpec struct {
	// Images are the images the Module's nodes need.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	Images []ModuleImageSpec `json:"images,omitempty"`

	// ImageRepoSecret is the Module's pull (and push) secret.
	// +optional
	ImageRepoSecret *corev1.LocalObjectReference `json:"imageRepoSecret,omitempty"`

	// ImagePullPolicy of the registry check.
	// +optional
	// +kubebuilder:default=IfNotPresent
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// PushBuiltImage says whether built images are pushed.
	// +optional
	PushBuiltImage bool `json:"pushBuiltImage,omitempty"`

	// ImageRebuildTriggerGeneration is the Module's spec.imageRebuildTriggerGeneration.
	// +optional
	ImageRebuildTriggerGeneration *int64 `json:"imageRebuildTriggerGeneration,omitempty"`

	// Tolerations of the build and sign pods.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// ImageTransition is one entry of an image's transition log.
type ImageTransition struct {
	// Trigger that caused the transition.
	// +kubebuilder:validation:MaxLength=64
	Trigger string `json:"trigger"`
	// From is the state before.
	From ImageMachineState `json:"from"`
	// To is the state after.
	To ImageMachineState `json:"to"`
	// Time of the transition.
	Time metav1.Time `json:"time"`
	// Reason is a short CamelCase explanation.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`
}

// ModuleImageState is what is known about one image. Image and Status are upstream's; the rest is
// kmm's image machine, written only by the image controller.
type ModuleImageState struct {
	// Image is the image of the spec entry this state is for.
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`

	// Status is upstream's summary: Exists, DoesNotExist, NeedsBuilding or NeedsSigning (empty
	// while kmm checks the registry).
	// +optional
	Status ImageState `json:"status,omitempty"`

	// State of kmm's image machine. Empty in an entry upstream wrote: kmm checks such an image
	// again at first sight.
	// +optional
	State ImageMachineState `json:"state,omitempty"`

	// Reason is a short CamelCase explanation of the state.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`

	// Message explains the state in words (for a failed build, the tail of its log).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`

	// Attempts counts consecutive failures (registry errors, failed builds, failed signs) since
	// the last success; the back-off grows with it.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// Run numbers the build and sign pods: each entry into Building or Signing starts a new run,
	// and only the outcome of the current run's pod counts.
	// +optional
	Run int32 `json:"run,omitempty"`

	// RebuildTriggerGeneration is the spec's imageRebuildTriggerGeneration the image was last
	// checked for; a different one in the spec has it checked (and built if missing) again.
	// +optional
	RebuildTriggerGeneration *int64 `json:"rebuildTriggerGeneration,omitempty"`

	// LastTransitionTime is when State last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`

	// LastCheckTime is when the registry was last asked about the image.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`

	// Transitions is the bounded log of the image's transitions, oldest first.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Transitions []ImageTransition `json:"transitions,omitempty"`
}

// ModuleImagesConfigStatus is what is known about the Module's images.
type ModuleImagesConfigStatus struct {
	// ImagesStates has one entry per image of the spec.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	ImagesStates []ModuleImageState `json:"imagesStates,omitempty"`

	// ImageRebuildTriggerGeneration is upstream's record of the last rebuild trigger it acted on;
	// kmm keeps it per image (imagesStates[].rebuildTriggerGeneration) and only reads this one.
	// +optional
	ImageRebuildTriggerGeneration *int64 `json:"imageRebuildTriggerGeneration,omitempty"`
}

// ModuleImagesConfig holds the images of one Module and what is known about each: whether it is in
// its registry, being built or signed, or failing. Internal: written by kmm, read by kmm and
// `kubectl kmm`.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=moduleimagesconfigs,scope=Namespaced,shortName=mic
// +kubebuilder:subresource:status
type ModuleImagesConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ModuleImagesConfigSpec   `json:"spec,omitempty"`
	Status ModuleImagesConfigStatus `json:"status,omitempty"`
}

// ModuleImagesConfigList is a list of ModuleImagesConfigs.
//
// +kubebuilder:object:root=true
type ModuleImagesConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModuleImagesConfig `json:"items"`
}

// ImageStateEntry returns the status entry of image, or nil.
func (m *ModuleImagesConfig) ImageStateEntry(image string) *ModuleImageState {
	for i := range m.Status.ImagesStates {
		if m.Status.ImagesStates[i].Image == image {
			return &m.Status.ImagesStates[i]
		}
	}
	return nil
}
