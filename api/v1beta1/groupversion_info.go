// Package v1beta1 holds the kmm.sigs.x-k8s.io/v1beta1 API: the user-facing Module, compatible with
// the upstream Kernel Module Management operator, the operator-internal NodeModulesConfig that
// records, per node, what should be loaded (spec) and what is true (status, with the state machine),
// PreflightValidation, upstream's check of every Module against a kernel before an upgrade, and
// ModuleImagesConfig, the images a Module needs and the record of their build and sign.
//
// +kubebuilder:object:generate=true
// +groupName=kmm.sigs.x-k8s.io
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "kmm.sigs.x-k8s.io", Version: "v1beta1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Module{}, &ModuleList{}, &NodeModulesConfig{}, &NodeModulesConfigList{},
		&PreflightValidation{}, &PreflightValidationList{}, &ModuleImagesConfig{}, &ModuleImagesConfigList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
