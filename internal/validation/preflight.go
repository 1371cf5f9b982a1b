package validation

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/internal/kernel"
)

// PreflightValidation checks what admission enforces on a PreflightValidation: the target kernel
// parses as a kernel version (the schema cannot say so). pushBuiltImage is accepted (docs/api.md).
func PreflightValidation(pv *kmmv1beta2.PreflightValidation) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if _, err := kernel.Parse(pv.Spec.KernelVersion); err != nil {
		errs = append(errs, field.Invalid(spec.Child("kernelVersion"), pv.Spec.KernelVersion,
			"not a kernel version as node.status.nodeInfo.kernelVersion shows one: "+err.Error()))
	}
	return errs
}
