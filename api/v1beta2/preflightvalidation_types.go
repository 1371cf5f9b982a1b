package v1beta2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The verification statuses of a Module in a PreflightValidation (upstream KMM's v1beta2 values).
const (
	// VerificationSuccess: the Module is served on the target kernel (a kernel mapping matches and
	// its image exists for the nodes' platforms).
	VerificationSuccess = "Success"
	// VerificationFailure: it is not; the entry's reason says why. The stage is Done.
	VerificationFailure = "Failure"
	// VerificationInProgress: the check has no final answer yet (the registry could not be reached,
	// or the pull secret could not be read) and is retried with back-off. The stage is Image.
	VerificationInProgress = "InProgress"
)

// The verification stages (upstream KMM's v1beta2 values: it dropped Build, Sign and Requeued).
const (
	// VerificationStageImage: the image check did not reach a final answer and is retried.
	VerificationStageImage = "Image"
	// VerificationStageDone: the verification of this Module has its final answer (until the Module
	// or the PreflightValidation changes).
	VerificationStageDone = "Done"
)

// MaxPreflightModules bounds status.modules of a PreflightValidation: the Modules verified in one
// cluster. The controller reports the first ones by namespace and name and says, in an Event, how
// many it left out.
const MaxPreflightModules = 2000

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
//
// +kubebuilder:validation:XValidation:rule="self.verificationStatus != 'InProgress' || self.verificationStage == 'Image'",message="an InProgress verification is at stage Image"
// +kubebuilder:validation:XValidation:rule="self.verificationStatus != 'Failure' || self.verificationStage == 'Done'",message="a Failure is final: its stage is Done"
type PreflightValidationModuleStatus struct {
	// Namespace of the Module.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`

	// Name of the Module.
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// VerificationStatus is Success when the Module is served on the target kernel, Failure when
	// it is not, InProgress while the check is retried.
	// +kubebuilder:validation:Enum=Success;Failure;InProgress
	VerificationStatus string `json:"verificationStatus"`

	// VerificationStage is Image while the image check is retried, Done once it has its answer.
	// +kubebuilder:validation:Enum=Image;Done
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
// kernel: whether a kernel mapping matches it and the image that mapping names exists. This is
// the stored version; v1beta1 is served by conversion.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pfv
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Kernel",type=string,JSONPath=`.spec.kernelVersion`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PreflightValidation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PreflightValidationSpec   `json:"spec"`
	Status PreflightValidationStatus `json:"status,omitempty"`
}

// Hub marks PreflightValidation as the version the others convert to and from.
func (*PreflightValidation) Hub() {}

// PreflightValidationList is a list of PreflightValidations.
//
// +kubebuilder:object:root=true
type PreflightValidationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PreflightValidation `json:"items"`
}
