package webhook

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/internal/validation"
)

// +kubebuilder:webhook:path=/validate-kmm-sigs-x-k8s-io-v1beta2-preflightvalidation,mutating=false,failurePolicy=fail,sideEffects=None,groups=kmm.sigs.x-k8s.io,resources=preflightvalidations,verbs=create;update,versions=v1beta2,name=vpreflightvalidation.kmm.sigs.x-k8s.io,admissionReviewVersions=v1

// PreflightValidator is the validating admission webhook for PreflightValidations: it rejects a
// target kernel that is not a kernel version (validation.PreflightValidation). It is registered for
// the stored version, v1beta2: the API server converts a v1beta1 request before calling it
// (matchPolicy Equivalent), and registering the type also serves the conversion webhook (/convert).
type PreflightValidator struct{}

var _ admission.Validator[*kmmv1beta2.PreflightValidation] = PreflightValidator{}

// SetupPreflightWebhook registers the PreflightValidation validating webhook with the manager's
// webhook server.
func SetupPreflightWebhook(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &kmmv1beta2.PreflightValidation{}).WithValidator(PreflightValidator{}).Complete()
}

// ValidateCreate rejects an invalid new PreflightValidation.
func (PreflightValidator) ValidateCreate(_ context.Context, pv *kmmv1beta2.PreflightValidation) (admission.Warnings, error) {
	return nil, invalidPreflight(pv)
}

// ValidateUpdate rejects an invalid change to a PreflightValidation.
func (PreflightValidator) ValidateUpdate(_ context.Context, _, pv *kmmv1beta2.PreflightValidation) (admission.Warnings, error) {
	return nil, invalidPreflight(pv)
}

// ValidateDelete allows every deletion.
func (PreflightValidator) ValidateDelete(context.Context, *kmmv1beta2.PreflightValidation) (admission.Warnings, error) {
	return nil, nil
}

func invalidPreflight(pv *kmmv1beta2.PreflightValidation) error {
	errs := validation.PreflightValidation(pv)
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(kmmv1beta2.GroupVersion.WithKind("PreflightValidation").GroupKind(), pv.Name, errs)
}
