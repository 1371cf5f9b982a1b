package validation

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The rules below are the ones the API server applies to the pods and DaemonSets kmm derives from a
// Module. Checked at admission, a mistake is reported on the Module's own field instead of failing
// every worker pod creation later.

// validateSelector checks that every selector entry is a valid label key and value: it becomes
// the device plugin DaemonSet's node selector and a label selector over nodes.
func validateSelector(p *field.Path, selector map[string]string) field.ErrorList {
	var errs field.ErrorList
	for k, v := range selector {
		for _, msg := range apivalidation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p.Key(k), k, "not a valid label key: "+msg))
		}
		for _, msg := range apivalidation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(p.Key(k), v, "not a valid label value: "+msg))
		}
	}
	return errs
}

var (
	tolerationOperators = []string{string(corev1.TolerationOpExists), string(corev1.TolerationOpEqual)}
	taintEffects        = []string{string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectPreferNoSchedule), string(corev1.TaintEffectNoExecute)}
)

// validateTolerations applies the pod rules for tolerations: they go into every worker and device
// plugin pod.
func validateTolerations(p *field.Path, tolerations []corev1.Toleration) field.ErrorList {
	var errs field.ErrorList
	for i := range tolerations {
		errs = append(errs, validateToleration(p.Index(i), &tolerations[i])...)
	}
	return errs
}

func validateToleration(p *field.Path, t *corev1.Toleration) field.ErrorList {
	var errs field.ErrorList
	if t.Key != "" {
		for _, msg := range apivalidation.IsQualifiedName(t.Key) {
			errs = append(errs, field.Invalid(p.Child("key"), t.Key, msg))
		}
	}
	switch {
	case t.Operator != "" && !slices.Contains(tolerationOperators, string(t.Operator)):
		errs = append(errs, field.NotSupported(p.Child("operator"), t.Operator, tolerationOperators))
	case t.Key == "" && t.Operator != corev1.TolerationOpExists:
		errs = append(errs, field.Invalid(p.Child("operator"), t.Operator, "operator must be Exists when key is empty (a toleration of every taint)"))
	}
	if t.Operator == corev1.TolerationOpExists && t.Value != "" {
		errs = append(errs, field.Invalid(p.Child("value"), t.Value, "value must be empty when operator is Exists"))
	}
	for _, msg := range apivalidation.IsValidLabelValue(t.Value) {
		errs = append(errs, field.Invalid(p.Child("value"), t.Value, msg))
	}
	if t.Effect != "" && !slices.Contains(taintEffects, string(t.Effect)) {
		errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect, taintEffects))
	}
	if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
		errs = append(errs, field.Invalid(p.Child("effect"), t.Effect, "effect must be NoExecute when tolerationSeconds is set"))
	}
	return errs
}

// validateServiceAccount checks a service account name as the pod spec does (a DNS-1123 subdomain).
func validateServiceAccount(p *field.Path, name string) field.ErrorList {
	if name == "" {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range apivalidation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}
