package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/contract"
)

// RunInput is everything an OutcomeFunc may look at: the facts of one simulated worker run.
type RunInput struct {
	// Node is the node the pod runs on.
	Node string
	// NodeKernel is the node's current kernel version.
	NodeKernel string
	// BootID is the node's current boot ID.
	BootID string
	// Action is the pod's contract.LabelAction.
	Action contract.Action
	// Config is the worker Config parsed from the pod's contract.AnnotationConfig.
	Config contract.Config
	// Pod is the worker pod; an OutcomeFunc must not modify it.
	Pod *corev1.Pod
}

// Verdict is how a simulated worker run ends. The agent turns it into a contract.Result.
type Verdict struct {
	// Outcome is contract.OutcomeSucceeded or contract.OutcomeFailed.
	Outcome contract.Outcome
	// Reason classifies a failure; it must be empty on success.
	Reason contract.Reason
	// Message explains a failure.
	Message string
	// Stderr is a simulated modprobe standard error tail.
	Stderr string
	// ImageDigest, when set, is reported instead of the agent's stand-in digest (for example by an
	// OutcomeFunc that runs the real worker).
	ImageDigest string
	// FailedStep is, for a failed reload, the half that failed (contract.StepUnload or StepLoad);
	// empty means StepUnload: nothing was unloaded.
	FailedStep string
	// HookExit is the exit code of the pod's hook container (spec.moduleLoader.hooks), if it has
	// one and it runs: a preUnload hook that exits non-zero keeps the worker from running (the
	// module stays loaded); a postLoad hook runs after a load that succeeded.
	HookExit int32
	// HookMessage is the hook's termination message (its log's tail).
	HookMessage string
}

// OutcomeFunc decides how a worker run ends. It must be pure and fast: the agent calls it with its
// lock held.
type OutcomeFunc func(in RunInput) Verdict

// Succeeded is the verdict of a run that did what it was asked.
func Succeeded() Verdict { return Verdict{Outcome: contract.OutcomeSucceeded} }

// Failed is the verdict of a run that failed for reason with message.
func Failed(reason contract.Reason, message string) Verdict {
	return Verdict{Outcome: contract.OutcomeFailed, Reason: reason, Message: message}
}

// brokenImageMarkers make DefaultOutcome fail a load with ImagePull when the image reference
// contains one of them.
var brokenImageMarkers = []string{"broken", "doesnotexist"}

// refusedConfigMarker makes DefaultOutcome refuse a load's config (InvalidConfig) when the image
// reference contains it, as a worker of another version than the operator might.
const refusedConfigMarker = "refusedconfig"

// DefaultOutcome is the outcome an Agent uses unless Options.Outcome says otherwise. A load fails
// with InvalidConfig when the image reference contains "refusedconfig", with ImagePull when it
// contains "broken" or "doesnotexist", with NotFound when
// the config was resolved for another kernel than the node runs, and succeeds otherwise. An unload
// always succeeds: unloading a module that is not loaded is not an error. A reload is an unload
// and a load: its load half fails as a load would, reported as the unload half (nothing unloaded)
// when the real worker finds it before unloading (a refused config, an image it cannot pull).
func DefaultOutcome(in RunInput) Verdict {
	switch in.Action {
	case contract.ActionLoad:
		return loadOutcome(in)
	case contract.ActionReload:
		v := loadOutcome(in)
		if v.Outcome == contract.OutcomeFailed && v.Reason == contract.ReasonNotFound {
			v.FailedStep = contract.StepLoad
		}
		return v
	}
	return Succeeded()
}

// loadOutcome is DefaultOutcome's verdict for loading in.Config.
func loadOutcome(in RunInput) Verdict {
	mc := in.Config.Config
	if strings.Contains(mc.ContainerImage, refusedConfigMarker) {
		return Failed(contract.ReasonInvalidConfig, "invalid config: simulated: this worker refuses "+mc.ContainerImage)
	}
	for _, m := range brokenImageMarkers {
		if strings.Contains(mc.ContainerImage, m) {
			return Failed(contract.ReasonImagePull, fmt.Sprintf("pulling %s: simulated: MANIFEST_UNKNOWN: manifest unknown", mc.ContainerImage))
		}
	}
	if mc.KernelVersion != in.NodeKernel {
		dir := mc.Modprobe.DirName
		if dir == "" {
			dir = contract.DefaultDirName
		}
		return Failed(contract.ReasonNotFound, fmt.Sprintf("module %s: %s not found in image %s (config for kernel %s, node runs %s)",
			mc.Modprobe.ModuleName, path.Join(dir, "lib/modules", in.NodeKernel), mc.ContainerImage, mc.KernelVersion, in.NodeKernel))
	}
	return Succeeded()
}

// ImageDigest is the digest the agent reports for an image reference: sha256 of the reference.
func ImageDigest(image string) string {
	sum := sha256.Sum256([]byte(image))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// buildResult is the contract.Result a real worker would write for in ending with v on a node whose
// current boot ID is bootID.
func buildResult(in RunInput, bootID string, v Verdict) contract.Result {
	mc := in.Config.Config
	r := contract.Result{
		Action:       in.Action,
		Namespace:    in.Config.Namespace,
		Name:         in.Config.Name,
		KernelModule: mc.Modprobe.ModuleName,
		Version:      mc.Version,
		Kernel:       mc.KernelVersion,
		BootID:       bootID,
		Outcome:      v.Outcome,
		Reason:       v.Reason,
		Message:      v.Message,
		Stderr:       v.Stderr,
	}
	if in.Action == contract.ActionReload && v.Outcome == contract.OutcomeFailed {
		r.FailedStep = v.FailedStep
		if r.FailedStep == "" {
			r.FailedStep = contract.StepUnload
		}
	}
	if mc.ContainerImage != "" && v.Reason != contract.ReasonImagePull {
		r.ImageDigest = ImageDigest(mc.ContainerImage)
	}
	if v.ImageDigest != "" {
		r.ImageDigest = v.ImageDigest
	}
	return r
}

// podResult is the Result of a pod the agent fails without running it (bad config, reboot,
// deletion): the Module comes from the config when it parses and from the pod labels otherwise.
func podResult(pod *corev1.Pod, bootID, message string) contract.Result {
	in := RunInput{Action: contract.Action(pod.Labels[contract.LabelAction])}
	if cfg, err := contract.ParseConfig([]byte(pod.Annotations[contract.AnnotationConfig])); err == nil {
		in.Config = cfg
	} else {
		in.Config.Namespace, in.Config.Name = pod.Labels[contract.LabelModuleNamespace], pod.Labels[contract.LabelModuleName]
	}
	r := buildResult(in, bootID, Failed(contract.ReasonOther, message))
	r.ImageDigest = ""
	return r
}
