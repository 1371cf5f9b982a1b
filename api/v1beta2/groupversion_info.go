// Package v1beta2 holds the kmm.sigs.x-k8s.io/v1beta2 API: PreflightValidation in the shape upstream
// Kernel Module Management stores today (verification status Success, Failure or InProgress), the
// version kmm stores and its controllers work on. api/v1beta1's PreflightValidation is served too
// and converted to and from this one (the conversion hub) by kmm's conversion webhook.
//
// +kubebuilder:object:generate=true
// +groupName=kmm.sigs.x-k8s.io
package v1beta2

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "kmm.sigs.x-k8s.io", Version: "v1beta2"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &PreflightValidation{}, &PreflightValidationList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
