package preflight

import (
	"fmt"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// Outcome is what the registry said about an image.
type Outcome string

// The outcomes of an image check.
const (
	// Found: the manifest exists (and, for an index, holds every platform asked for).
	Found Outcome = "Found"
	// NotFound: the registry answered that the manifest (or a platform in the index) does not exist.
	NotFound Outcome = "NotFound"
	// Denied: the registry refused the credentials (401, 403), or the pull secret does not exist.
	Denied Outcome = "Denied"
	// Unreachable: no answer in time, a network or TLS failure, or a server error.
	Unreachable Outcome = "Unreachable"
	// SecretForbidden: the operator may not read the pull secret; the registry was not asked.
	SecretForbidden Outcome = "SecretForbidden"
)

// CheckResult is the answer of one image check.
type CheckResult struct {
	Outcome Outcome
	// Digest is the manifest digest, when Found.
	Digest string
	// Detail says what the registry answered, for the message.
	Detail string
}

// Target is what must be checked for a Module: the image its kernel mapping names for the target
// kernel and how to reach it, as the worker would pull it.
type Target struct {
	Image       string
	RegistryTLS kmmv1beta1.TLSOptions
	// PullSecret is the name of the Module's imageRepoSecret in the Module's namespace ("": none).
	PullSecret string
}

// Verdict is the verification of one Module for the target kernel.
type Verdict struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Verified says whether the Module is served on the kernel.
	Verified bool `json:"verified"`
	// Reason is one of the kmmv1beta1.PreflightReason* words.
	Reason string `json:"reason"`
	// Message says in words what was found.
	Message string `json:"message"`
	// Image is the image the mapping names, variables substituted ("" without a mapping).
	Image string `json:"image,omitempty"`
	// Final is false when the check is to be retried (the registry could not be reached).
	Final bool `json:"final"`
}

// Key is the Module's namespace/name.
func (v Verdict) Key() string { return v.Namespace + "/" + v.Name }

// Plan returns the image check a Module needs for kernel, or, when none is needed, its verdict:
// no mapping matches, the kernel or the Module cannot be evaluated, or the Module has no module
// loader (nothing to load, so nothing can be missing). The mapping is chosen by mapping.Resolve,
// the code the Module→NMC decision runs.
func Plan(m *kmmv1beta1.Module, kernel string) (*Target, *Verdict) {
	v := &Verdict{Namespace: m.Namespace, Name: m.Name, Final: true}
	if m.Spec.DevicePluginOnly() {
		v.Verified, v.Reason, v.Message = true, kmmv1beta1.PreflightReasonSuccess, "the Module has no moduleLoader: nothing to load on any kernel"
		return nil, v
	}
	cfg, reason, err := mapping.Resolve(m, kernel)
	if err != nil {
		v.Reason, v.Message = resolveReason(reason), err.Error()
		return nil, v
	}
	t := &Target{Image: cfg.ContainerImage, RegistryTLS: cfg.RegistryTLS}
	if m.Spec.ImageRepoSecret != nil {
		t.PullSecret = m.Spec.ImageRepoSecret.Name
	}
	return t, nil
}

// resolveReason maps the reasons of mapping.Resolve to preflight reasons.
func resolveReason(reason string) string {
	switch reason {
	case mapping.ReasonNoKernelMapping:
		return kmmv1beta1.PreflightReasonNoMapping
	case mapping.ReasonInvalidKernel:
		return kmmv1beta1.PreflightReasonInvalidKernel
	}
	return kmmv1beta1.PreflightReasonInvalidSpec
}

// Decide is the verification of Module m for kernel, given what the registry said about the image
// Plan named (check is ignored when Plan needs no check).
func Decide(m *kmmv1beta1.Module, kernel string, check CheckResult) Verdict {
	t, v := Plan(m, kernel)
	if v != nil {
		return *v
	}
	out := Verdict{Namespace: m.Namespace, Name: m.Name, Image: t.Image, Final: true}
	switch check.Outcome {
	case Found:
		out.Verified, out.Reason = true, kmmv1beta1.PreflightReasonSuccess
		out.Message = fmt.Sprintf("kernel %s is served: image %s exists", kernel, t.Image)
		if check.Digest != "" {
			out.Message += " (" + check.Digest + ")"
		}
	case NotFound:
		out.Reason = kmmv1beta1.PreflightReasonImageMissing
		out.Message = fmt.Sprintf("image %s does not exist: %s", t.Image, check.Detail)
	case Denied:
		out.Reason = kmmv1beta1.PreflightReasonUnauthorized
		out.Message = fmt.Sprintf("the registry refused access to %s: %s", t.Image, check.Detail)
	case SecretForbidden:
		// Not final: checked again with back-off, so that a RoleBinding created later is used.
		out.Reason, out.Final = kmmv1beta1.PreflightReasonSecretForbidden, false
		out.Message = fmt.Sprintf("%s was not checked: %s", t.Image, check.Detail)
	default:
		out.Reason, out.Final = kmmv1beta1.PreflightReasonRegistryUnreachable, false
		out.Message = fmt.Sprintf("the registry of %s could not be asked: %s", t.Image, check.Detail)
	}
	return out
}
