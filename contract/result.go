package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Action is what a worker run does.
type Action string

// The worker's actions, also its CLI subcommands.
const (
	// ActionLoad pulls the image, installs firmware and loads the module.
	ActionLoad Action = "load"
	// ActionUnload pulls the image (usually from the cache) and unloads the module.
	ActionUnload Action = "unload"
	// ActionReload unloads the config's Previous (as ActionUnload would) and then loads the config
	// (as ActionLoad would), in one run: an image bump with nothing to drain between the two.
	ActionReload Action = "reload"
)

// The halves of a reload, as Result.FailedStep names them.
const (
	// StepUnload: the run stopped before the previous config was unloaded, or while unloading it
	// (a config check, pulling either image, modprobe -r): the previous config is still loaded.
	StepUnload = "unload"
	// StepLoad: the previous config was unloaded, and the new one did not load.
	StepLoad = "load"
)

// Outcome says whether a worker run did what it was asked.
type Outcome string

// The outcomes of a worker run.
const (
	// OutcomeSucceeded: the module is loaded (load) or not loaded (unload).
	OutcomeSucceeded Outcome = "Succeeded"
	// OutcomeFailed: see Reason, Message and Stderr.
	OutcomeFailed Outcome = "Failed"
)

// Reason classifies a failure for the operator's retry and status logic.
type Reason string

// The failure classes. Every failed Result has exactly one.
const (
	// ReasonImagePull: the kmod image could not be pulled: bad reference, registry unreachable,
	// TLS or authentication failure, image not found, or not cached with imagePullPolicy Never.
	ReasonImagePull Reason = "ImagePull"
	// ReasonNotFound: the image has no <dirName>/lib/modules/<kernel> directory (or no firmware
	// path), or modprobe did not find the module in it.
	ReasonNotFound Reason = "NotFound"
	// ReasonBusy: modprobe could not remove a module because it is in use.
	ReasonBusy Reason = "Busy"
	// ReasonInvalidConfig: the worker refused its config (malformed, or a field it cannot act on,
	// such as a kernel version with "/" or a firmwarePath of "/"). Retrying the same config cannot
	// help: the operator keeps the pair failed until the config changes.
	ReasonInvalidConfig Reason = "InvalidConfig"
	// ReasonOther: anything else, including unsafe archive entries, an oversize image and other
	// modprobe failures.
	ReasonOther Reason = "Other"
)

// Terminal says whether retrying the same config cannot succeed.
func (r Reason) Terminal() bool { return r == ReasonInvalidConfig }

// MaxResultBytes bounds the encoded Result: Kubernetes keeps at most 4096 bytes of a termination message.
const MaxResultBytes = 4096

// maxStderrBytes and maxMessageBytes are the tails kept before any further shrinking.
const (
	maxStderrBytes  = 2048
	maxMessageBytes = 1024
)

// Result is what a worker run reports, as JSON in the container's termination message. The JSON
// field names are a stable contract with the operator; parse it with ParseResult.
type Result struct {
	// Action is load, unload, reload or sign.
	Action Action `json:"action"`
	// Namespace of the Module.
	Namespace string `json:"namespace"`
	// Name of the Module.
	Name string `json:"name"`
	// KernelModule is modprobe.moduleName (empty with rawArgs only).
	KernelModule string `json:"kernelModule,omitempty"`
	// Version is the Module version of the config, for ordered upgrades.
	Version string `json:"version,omitempty"`
	// Kernel is the kernel version the config was resolved for.
	Kernel string `json:"kernel"`
	// BootID is the node's boot ID, read from <hostroot>/proc/sys/kernel/random/boot_id.
	BootID string `json:"bootID,omitempty"`
	// ImageDigest is the digest the image reference resolved to (sha256:...); for a sign, the
	// digest of the signed image pushed.
	ImageDigest string `json:"imageDigest,omitempty"`
	// FromCache is true when the image content came from the cache without downloading layers.
	FromCache bool `json:"fromCache,omitempty"`
	// Outcome is Succeeded or Failed.
	Outcome Outcome `json:"outcome"`
	// Reason classifies a failure; empty on success.
	Reason Reason `json:"reason,omitempty"`
	// Message explains a failure.
	Message string `json:"message,omitempty"`
	// Stderr is the tail of modprobe's standard error on a modprobe failure.
	Stderr string `json:"stderr,omitempty"`
	// FailedStep is, for a failed reload, the half that failed: StepUnload (the previous config is
	// still loaded) or StepLoad (it was unloaded; the new one is not loaded). Empty otherwise.
	FailedStep string `json:"failedStep,omitempty"`
}

// Marshal encodes r as one JSON object of at most MaxResultBytes, shortening Stderr and Message
// (keeping their ends, where modprobe and wrapped errors say what went wrong) as needed.
func (r Result) Marshal() ([]byte, error) {
	r.Stderr = tail(r.Stderr, maxStderrBytes)
	r.Message = head(r.Message, maxMessageBytes)
	for {
		data, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		if len(data) <= MaxResultBytes {
			return data, nil
		}
		// Halve whichever of the two takes more room once escaped.
		switch {
		case r.Stderr == "" && r.Message == "":
			return nil, fmt.Errorf("result of %d bytes exceeds %d bytes even without stderr and message", len(data), MaxResultBytes)
		case jsonLen(r.Stderr) >= jsonLen(r.Message):
			r.Stderr = tail(r.Stderr, len(r.Stderr)/2)
		default:
			r.Message = head(r.Message, len(r.Message)/2)
		}
	}
}

// ParseResult decodes and checks a Result written by the worker. Unknown fields are ignored so that
// an older operator can read a newer worker's result.
func ParseResult(data []byte) (Result, error) {
	var r Result
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return Result{}, fmt.Errorf("worker result is not JSON: %w", err)
	}
	if err := r.check(); err != nil {
		return Result{}, fmt.Errorf("invalid worker result: %w", err)
	}
	return r, nil
}

func (r Result) check() error {
	switch r.Action {
	case ActionLoad, ActionUnload, ActionReload, ActionSign:
	default:
		return fmt.Errorf("unknown action %q", r.Action)
	}
	if err := r.checkStep(); err != nil {
		return err
	}
	switch r.Outcome {
	case OutcomeSucceeded:
		if r.Reason != "" {
			return fmt.Errorf("a succeeded result has reason %q", r.Reason)
		}
	case OutcomeFailed:
		switch r.Reason {
		case ReasonImagePull, ReasonNotFound, ReasonBusy, ReasonInvalidConfig, ReasonOther:
		case ReasonSignKey, ReasonSignInput, ReasonImagePush:
			if r.Action != ActionSign {
				return fmt.Errorf("reason %q outside a sign result", r.Reason)
			}
		default:
			return fmt.Errorf("a failed result needs reason ImagePull, NotFound, Busy, InvalidConfig, Other, SignKey, SignInput or ImagePush, got %q", r.Reason)
		}
	default:
		return fmt.Errorf("unknown outcome %q", r.Outcome)
	}
	if r.Namespace == "" && r.Name == "" && r.Outcome == OutcomeSucceeded {
		return errors.New("a succeeded result names no Module")
	}
	return nil
}

// checkStep: a failed reload names the half that failed; nothing else names one.
func (r Result) checkStep() error {
	failedReload := r.Action == ActionReload && r.Outcome == OutcomeFailed
	switch {
	case failedReload && r.FailedStep != StepUnload && r.FailedStep != StepLoad:
		return fmt.Errorf("a failed reload needs failedStep unload or load, got %q", r.FailedStep)
	case !failedReload && r.FailedStep != "":
		return fmt.Errorf("failedStep %q outside a failed reload", r.FailedStep)
	}
	return nil
}

// tail returns the last at most n bytes of s, starting on a UTF-8 boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}

// head returns the first at most n bytes of s, ending on a UTF-8 boundary.
func head(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// jsonLen is the length of s encoded as a JSON string.
func jsonLen(s string) int {
	data, _ := json.Marshal(s)
	return len(data)
}
