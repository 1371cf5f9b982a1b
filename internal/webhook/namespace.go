package webhook

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// +kubebuilder:webhook:path=/validate--v1-namespace,mutating=false,failurePolicy=fail,sideEffects=None,groups="",resources=namespaces,verbs=delete,versions=v1,name=vnamespace.kmm.sigs.x-k8s.io,admissionReviewVersions=v1

// NamespaceGuard refuses to delete a namespace that still holds Modules: their worker pods run in
// it, and once it is terminating no unload pod can be created, so their unload (and the deletion of
// the namespace with them) could never finish. config/webhook sends it only the namespaces labelled
// kmmv1beta1.NamespaceLabel (an objectSelector); it reads the Modules either way.
type NamespaceGuard struct {
	// Reader lists the namespace's Modules (the API server's answer, not a cache's).
	Reader client.Reader
}

var _ admission.Validator[*corev1.Namespace] = NamespaceGuard{}

// maxNamedModules bounds the Modules a refusal names.
const maxNamedModules = 10

// SetupNamespaceGuard registers the namespace guard with the manager's webhook server.
func SetupNamespaceGuard(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &corev1.Namespace{}).WithValidator(NamespaceGuard{Reader: mgr.GetAPIReader()}).Complete()
}

// ValidateCreate allows every namespace.
func (NamespaceGuard) ValidateCreate(context.Context, *corev1.Namespace) (admission.Warnings, error) {
	return nil, nil
}

// ValidateUpdate allows every change.
func (NamespaceGuard) ValidateUpdate(context.Context, *corev1.Namespace, *corev1.Namespace) (admission.Warnings, error) {
	return nil, nil
}

// ValidateDelete refuses the deletion while the namespace holds Modules, naming them.
func (g NamespaceGuard) ValidateDelete(ctx context.Context, ns *corev1.Namespace) (admission.Warnings, error) {
	modules := &kmmv1beta1.ModuleList{}
	if err := g.Reader.List(ctx, modules, client.InNamespace(ns.Name), client.Limit(maxNamedModules+1)); err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("cannot tell whether namespace %s holds Modules: %v", ns.Name, err))
	}
	if len(modules.Items) == 0 {
		return nil, nil
	}
	return nil, apierrors.NewForbidden(corev1.Resource("namespaces"), ns.Name, fmt.Errorf(
		"it holds Modules, whose unload worker pods run in it: delete %s first and wait until they are gone (kubectl delete modules -n %s --all --wait)",
		moduleNames(modules), ns.Name))
}

// moduleNames names the Modules of a list, at most maxNamedModules of them.
func moduleNames(modules *kmmv1beta1.ModuleList) string {
	names := make([]string, 0, maxNamedModules)
	for i := range modules.Items {
		if i == maxNamedModules {
			return "Modules " + strings.Join(names, ", ") + " and more"
		}
		names = append(names, modules.Items[i].Name)
	}
	if len(names) == 1 {
		return "Module " + names[0]
	}
	return "Modules " + strings.Join(names, ", ")
}
