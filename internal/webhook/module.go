// Package webhook serves kmm's admission webhooks. The rules live in internal/validation
// (validation.Admission) so that controllers can re-check them (validation.Module); this package
// adapts them to controller-runtime's admission interface.
package webhook

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/validation"
)

// +kubebuilder:webhook:path=/validate-kmm-sigs-x-k8s-io-v1beta1-module,mutating=false,failurePolicy=fail,sideEffects=None,groups=kmm.sigs.x-k8s.io,resources=modules,verbs=create;update,versions=v1beta1,name=vmodule.kmm.sigs.x-k8s.io,admissionReviewVersions=v1

// ModuleValidator is the validating admission webhook for Modules: it enforces the rules the CRD
// schema cannot express (regular expressions compile, image references parse, version ranges parse,
// label-key length budget).
type ModuleValidator struct{}

var _ admission.Validator[*kmmv1beta1.Module] = ModuleValidator{}

// SetupModuleWebhook registers the Module validating webhook with the manager's webhook server.
func SetupModuleWebhook(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &kmmv1beta1.Module{}).WithValidator(ModuleValidator{}).Complete()
}

// ValidateCreate rejects an invalid new Module.
func (ModuleValidator) ValidateCreate(_ context.Context, m *kmmv1beta1.Module) (admission.Warnings, error) {
	return nil, invalid(m, validation.Admission(m))
}

// ValidateUpdate rejects an invalid change to a Module.
func (ModuleValidator) ValidateUpdate(_ context.Context, oldModule, m *kmmv1beta1.Module) (admission.Warnings, error) {
	return nil, invalid(m, validation.ModuleUpdate(m, oldModule))
}

// ValidateDelete allows every deletion: unloading is the controllers' job.
func (ModuleValidator) ValidateDelete(context.Context, *kmmv1beta1.Module) (admission.Warnings, error) {
	return nil, nil
}

func invalid(m *kmmv1beta1.Module, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(kmmv1beta1.GroupVersion.WithKind("Module").GroupKind(), m.Name, errs)
}

// SetupWebhooks registers every kmm validating webhook (Module, PreflightValidation, the namespace
// guard) with the manager's webhook server.
func SetupWebhooks(mgr ctrl.Manager) error {
	if err := SetupModuleWebhook(mgr); err != nil {
		return err
	}
	if err := SetupNamespaceGuard(mgr); err != nil {
		return err
	}
	return SetupPreflightWebhook(mgr)
}
