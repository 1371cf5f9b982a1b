package v1beta1

import (
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/conversion"

	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
)

// PreflightValidation is served in this version and stored in v1beta2 (the hub); kmm's conversion
// webhook converts between them. The two differ only in the verification status:
//
//	v1beta1 True                 ⇄ v1beta2 Success (either stage)
//	v1beta1 False, stage Image   ⇄ v1beta2 InProgress (stage Image)
//	v1beta1 False, stage Done    ⇄ v1beta2 Failure (stage Done)
//
// v1beta2's schema allows InProgress only at stage Image and Failure only at stage Done, so the
// mapping is one to one on valid objects of either version and every object round-trips.
var _ conversion.Convertible = &PreflightValidation{}

// ConvertTo converts this PreflightValidation to the hub version (v1beta2).
func (pv *PreflightValidation) ConvertTo(hub conversion.Hub) error {
	dst, ok := hub.(*kmmv1beta2.PreflightValidation)
	if !ok {
		return fmt.Errorf("converting a v1beta1 PreflightValidation to %T: only v1beta2 is the hub", hub)
	}
	dst.ObjectMeta = pv.ObjectMeta
	dst.Spec = kmmv1beta2.PreflightValidationSpec{KernelVersion: pv.Spec.KernelVersion, PushBuiltImage: pv.Spec.PushBuiltImage}
	dst.Status = kmmv1beta2.PreflightValidationStatus{ObservedGeneration: pv.Status.ObservedGeneration}
	if pv.Status.Modules != nil {
		dst.Status.Modules = make([]kmmv1beta2.PreflightValidationModuleStatus, len(pv.Status.Modules))
	}
	for i, m := range pv.Status.Modules {
		dst.Status.Modules[i] = kmmv1beta2.PreflightValidationModuleStatus{
			Namespace: m.Namespace, Name: m.Name,
			VerificationStatus: statusToV1beta2(m.VerificationStatus, m.VerificationStage), VerificationStage: m.VerificationStage,
			Reason: m.Reason, StatusReason: m.StatusReason, Image: m.Image, LastTransitionTime: m.LastTransitionTime,
		}
	}
	return nil
}

// ConvertFrom converts the hub version (v1beta2) to this PreflightValidation.
func (pv *PreflightValidation) ConvertFrom(hub conversion.Hub) error {
	src, ok := hub.(*kmmv1beta2.PreflightValidation)
	if !ok {
		return fmt.Errorf("converting %T to a v1beta1 PreflightValidation: only v1beta2 is the hub", hub)
	}
	pv.ObjectMeta = src.ObjectMeta
	pv.Spec = PreflightValidationSpec{KernelVersion: src.Spec.KernelVersion, PushBuiltImage: src.Spec.PushBuiltImage}
	pv.Status = PreflightValidationStatus{ObservedGeneration: src.Status.ObservedGeneration}
	if src.Status.Modules != nil {
		pv.Status.Modules = make([]PreflightValidationModuleStatus, len(src.Status.Modules))
	}
	for i, m := range src.Status.Modules {
		pv.Status.Modules[i] = PreflightValidationModuleStatus{
			Namespace: m.Namespace, Name: m.Name,
			VerificationStatus: statusFromV1beta2(m.VerificationStatus), VerificationStage: m.VerificationStage,
			Reason: m.Reason, StatusReason: m.StatusReason, Image: m.Image, LastTransitionTime: m.LastTransitionTime,
		}
	}
	return nil
}

// statusToV1beta2 maps a v1beta1 verification status and stage to v1beta2's status; a value
// neither version knows passes unchanged (the schemas refuse it).
func statusToV1beta2(status, stage string) string {
	switch {
	case status == VerificationTrue:
		return kmmv1beta2.VerificationSuccess
	case status == VerificationFalse && stage == VerificationStageImage:
		return kmmv1beta2.VerificationInProgress
	case status == VerificationFalse:
		return kmmv1beta2.VerificationFailure
	}
	return status
}

// statusFromV1beta2 maps v1beta2's verification status to v1beta1's (the stage is the same).
func statusFromV1beta2(status string) string {
	switch status {
	case kmmv1beta2.VerificationSuccess:
		return VerificationTrue
	case kmmv1beta2.VerificationFailure, kmmv1beta2.VerificationInProgress:
		return VerificationFalse
	}
	return status
}
