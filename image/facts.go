package image

import (
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// Facts is everything Step knows about one (Module, image), gathered by the image controller.
type Facts struct {
	// Now is the time of the decision (the machine reads no clock).
	Now time.Time
	// Image is the image of the spec entry.
	Image string
	// Recipe says how the image can be made if it is missing.
	Recipe Recipe
	// Generation is the Module's imageRebuildTriggerGeneration (from the MIC spec).
	Generation *int64
	// Status is the image's previous status entry (zero for a new image, or one upstream wrote).
	Status kmmv1beta1.ModuleImageState
	// Registry is the registry's answer for Image, when the controller asked it in this decision
	// (because the previous Step of this decision planned CheckRegistry); nil otherwise.
	Registry *RegistryAnswer
	// BuildPods and SignPods are the image's build and sign pods that exist (at most one each:
	// their names are deterministic).
	BuildPods []Pod
	SignPods  []Pod
}

// Recipe is what the MIC spec entry says can be done about a missing image.
type Recipe struct {
	// Build: the entry has a build.
	Build bool
	// Sign: the entry has a sign (with Build, the build's output is signed; without, the
	// unsigned image is).
	Sign bool
}

// Answer is the registry's answer about an image.
type Answer string

// The registry's answers.
const (
	// AnswerPresent: the manifest exists.
	AnswerPresent Answer = "Present"
	// AnswerMissing: the registry says it does not (404, MANIFEST_UNKNOWN, NAME_UNKNOWN).
	AnswerMissing Answer = "Missing"
	// AnswerError: no answer (unreachable, a server error, refused credentials); retried with back-off.
	AnswerError Answer = "Error"
)

// RegistryAnswer is one registry check.
type RegistryAnswer struct {
	Answer Answer
	// Message says what the registry answered, for an error.
	Message string
}

// PodKind says what a pod does.
type PodKind string

// The kinds of pod the machine plans.
const (
	BuildPod PodKind = "build"
	SignPod  PodKind = "sign"
)

// PodPhase is how far a build or sign pod is.
type PodPhase string

// The phases Step tells apart.
const (
	PodRunning   PodPhase = "Running" // created, not finished (Pending counts too)
	PodSucceeded PodPhase = "Succeeded"
	PodFailed    PodPhase = "Failed"
)

// Pod is a build or sign pod as the controller sees it.
type Pod struct {
	// Run is the run number the pod was created for (a label on the pod).
	Run   int32
	Phase PodPhase
	// Message is, for a failed pod, the tail of its log or its termination message.
	Message string
}
