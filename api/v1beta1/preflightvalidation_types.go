package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The verification statuses of a Module in a PreflightValidation (upstream KMM's v1beta1 values).
const (
	// VerificationTrue: the Module is served on the target kernel (a kernel mapping matches and its
	// image exists for the nodes' platforms).
	VerificationTrue = "True"
	// VerificationFalse: it is not; the entry's reason says why.
	VerificationFalse = "False"
)

// The verification stages kmm reports. Upstream KMM also has Build and Sign (in-cluster build and
// signing) and Requeued; kmm builds and signs nothing, so a PreflightValidation never passes
// through them, and the schema rejects them.
const (
	// VerificationStageImage: the image check did not reach a final answer (the registry could not
	// be reached) and is retried with back-off.
	VerificationStageImage = "Image"
	// VerificationStageDone: the verification of this Module has its final answer (until the Module
	// or the PreflightValidation changes).
	VerificationStageDone = "Done"
)

// Reasons of a Module's preflight verification (PreflightValidationModuleStatus.Reason): kmm's
// addition to upstream's free-text statusReason, for scripts and alerts.
const (
	// PreflightReasonSuccess: the kernel mapping for the target kernel names an image that exists.
	PreflightReasonSuccess = "Success"
	// PreflightReasonNoMapping: no kernel mapping of the Module matches the target kernel.
	PreflightReasonNoMapping = "NoMapping"
	// PreflightReasonImageMissing: the registry answered that the image (or the nodes' platform in
	// its index) does not exist.
	PreflightReasonImageMissing = "ImageMissing"
	// PreflightReasonRegistryUnreachable: the registry did not answer in time, or answered with a
	// server error; retried with back-off.
	PreflightReasonRegistryUnreachable = "RegistryUnreachable"
	// PreflightReasonUnauthorized: the registry refused the Module's pull secret (or no secret), or
	// the imageRepoSecret does not exist.
	PreflightReasonUnauthorized = "Unauthorized"
	// PreflightReasonInvalidKernel: the target kernel version does not parse as a kernel version.
	PreflightReasonInvalidKernel = "InvalidKernelVersion"
	// PreflightReasonInvalidSpec: the Module cannot be evaluated (a mapping or image that does not
	// parse; it got past admission).
	PreflightReasonInvalidSpec = "InvalidSpec"
	// PreflightReasonSecretForbidden: the operator may not read the Module's imageRepoSecret (no
	// RoleBinding to kmm-secret-reader in the Module's namespace when it reads Secrets namespace by
	// namespace, docs/install.md); retried with back-off, so a RoleBinding created later is used.
	PreflightReasonSecretForbidden = "SecretForbidden"
)

// PreflightValidationSpec names the kernel that every Module is checked against.
type PreflightValidationSpec struct {
	// KernelVersion is the kernel the nodes will run after the upgrade, as
	// node.status.nodeInfo.kernelVersion will show it (e.g. 5.14.0-570.el9.x86_64).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	KernelVersion string `json:"kernelVersion"`

	// PushBuiltImage asks for the images of the Modules with a build (or sign) recipe to be built
	// and pushed for the target kernel ahead of the upgrade (upstream's field): the image controller
	// makes them, and such a Module's verdict stays InProgress until its image exists (docs/build.md).
	// +optional
	PushBuiltImage bool `json:"pushBuiltImage,omitempty"`
}

// PreflightValidationModuleStatus is the verification of one Module for the target kernel.
type PreflightValidationModuleStatus struct {
	// Namespace of the Module.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`

	// Name of the Module.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// VerificationStatus is True when the Module is served on the target kernel, False otherwise.
	// +kubebuilder:validation:Enum=True;False
	VerificationStatus string `json:"verificationStatus"`

	// VerificationStage is Image while the image check is retried, Done once it has its answer.
	// Upstream's Build and Sign stages do not exist in kmm.
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self in ['Image', 'Done']",message="verificationStage must be Image or Done: kmm does not build or sign modules, so there is no Build or Sign stage"
	VerificationStage string `json:"verificationStage"`

	// Reason is a CamelCase word: Success, NoMapping, ImageMissing, RegistryUnreachable,
	// Unauthorized, SecretForbidden, InvalidKernelVersion or InvalidSpec (kmm's addition).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`

	// StatusReason says in words what was found (upstream's field).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	StatusReason string `json:"statusReason,omitempty"`

	// Image is the kmod image the Module's kernel mapping gives for the target kernel, variables
	// substituted (kmm's addition; empty when no mapping matches).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image,omitempty"`

	// LastTransitionTime is when VerificationStatus or Reason last changed.
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
}

// PreflightValidationStatus holds the verification of every Module.
type PreflightValidationStatus struct {
	// Modules has one entry per Module, keyed by namespace and name.
	// +optional
	// +listType=map
	// +listMapKey=namespace
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=2000
	Modules []PreflightValidationModuleStatus `json:"modules,omitempty"`

	// ObservedGeneration is the generation of the spec the entries were verified against.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// PreflightValidation asks, before a kernel upgrade, whether every Module is served on the new
// kernel: whether a kernel mapping matches it and the image that mapping names exists. This
// version is served and converted to and from v1beta2, the stored version.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pfv
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Kernel",type=string,JSONPath=`.spec.kernelVersion`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PreflightValidation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PreflightValidationSpec   `json:"spec"`
	Status PreflightValidationStatus `json:"status,omitempty"`
}

// PreflightValidationList is a list of PreflightValidations.
//
// +kubebuilder:object:root=true
type PreflightValidationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PreflightValidation `json:"items"`
}
