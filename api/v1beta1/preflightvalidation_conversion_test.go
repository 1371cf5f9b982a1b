package v1beta1_test

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
)

// meta draws the metadata a PreflightValidation may carry.
func meta(t *rapid.T) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:            rapid.StringMatching(`[a-z][a-z0-9-]{0,20}`).Draw(t, "name"),
		Generation:      rapid.Int64Range(0, 1000).Draw(t, "generation"),
		ResourceVersion: rapid.StringMatching(`[0-9]{0,6}`).Draw(t, "resourceVersion"),
		Labels:          rapid.MapOf(rapid.StringMatching(`[a-z]{1,5}`), rapid.StringMatching(`[a-z0-9]{0,5}`)).Draw(t, "labels"),
		Annotations:     rapid.MapOf(rapid.StringMatching(`[a-z]{1,5}`), rapid.String()).Draw(t, "annotations"),
	}
}

// entry draws the fields both versions' entries share; status and stage are set by the caller.
func entry(t *rapid.T) kmmv1beta2.PreflightValidationModuleStatus {
	return kmmv1beta2.PreflightValidationModuleStatus{
		Namespace:          rapid.StringMatching(`[a-z]{1,8}`).Draw(t, "namespace"),
		Name:               rapid.StringMatching(`[a-z]{1,8}`).Draw(t, "module"),
		Reason:             rapid.SampledFrom([]string{"", kmmv1beta1.PreflightReasonSuccess, kmmv1beta1.PreflightReasonNoMapping, kmmv1beta1.PreflightReasonRegistryUnreachable}).Draw(t, "reason"),
		StatusReason:       rapid.String().Draw(t, "statusReason"),
		Image:              rapid.String().Draw(t, "image"),
		LastTransitionTime: metav1.NewTime(time.Unix(rapid.Int64Range(0, 1<<34).Draw(t, "time"), 0)),
	}
}

// genV1beta1 draws a PreflightValidation valid under v1beta1's schema (any status with any stage).
func genV1beta1(t *rapid.T) *kmmv1beta1.PreflightValidation {
	pv := &kmmv1beta1.PreflightValidation{ObjectMeta: meta(t)}
	pv.Spec = kmmv1beta1.PreflightValidationSpec{KernelVersion: rapid.StringMatching(`[0-9]\.[0-9]+\.[0-9]-[a-z0-9.]{0,10}`).Draw(t, "kernel")}
	pv.Status.ObservedGeneration = rapid.Int64Range(0, 1000).Draw(t, "observed")
	if rapid.Bool().Draw(t, "hasModules") {
		pv.Status.Modules = []kmmv1beta1.PreflightValidationModuleStatus{}
	}
	for range rapid.IntRange(0, 5).Draw(t, "modules") {
		e := entry(t)
		pv.Status.Modules = append(pv.Status.Modules, kmmv1beta1.PreflightValidationModuleStatus{
			Namespace: e.Namespace, Name: e.Name, Reason: e.Reason, StatusReason: e.StatusReason, Image: e.Image, LastTransitionTime: e.LastTransitionTime,
			VerificationStatus: rapid.SampledFrom([]string{kmmv1beta1.VerificationTrue, kmmv1beta1.VerificationFalse}).Draw(t, "status"),
			VerificationStage:  rapid.SampledFrom([]string{kmmv1beta1.VerificationStageImage, kmmv1beta1.VerificationStageDone}).Draw(t, "stage"),
		})
	}
	return pv
}

// v1beta2Valid says whether a status and stage pass v1beta2's schema.
func v1beta2Valid(status, stage string) bool {
	switch status {
	case kmmv1beta2.VerificationSuccess:
		return stage == kmmv1beta2.VerificationStageImage || stage == kmmv1beta2.VerificationStageDone
	case kmmv1beta2.VerificationInProgress:
		return stage == kmmv1beta2.VerificationStageImage
	case kmmv1beta2.VerificationFailure:
		return stage == kmmv1beta2.VerificationStageDone
	}
	return false
}

// genV1beta2 draws a PreflightValidation valid under v1beta2's schema.
func genV1beta2(t *rapid.T) *kmmv1beta2.PreflightValidation {
	pv := &kmmv1beta2.PreflightValidation{ObjectMeta: meta(t)}
	pv.Spec = kmmv1beta2.PreflightValidationSpec{KernelVersion: rapid.StringMatching(`[0-9]\.[0-9]+\.[0-9]-[a-z0-9.]{0,10}`).Draw(t, "kernel")}
	pv.Status.ObservedGeneration = rapid.Int64Range(0, 1000).Draw(t, "observed")
	if rapid.Bool().Draw(t, "hasModules") {
		pv.Status.Modules = []kmmv1beta2.PreflightValidationModuleStatus{}
	}
	combos := [][2]string{
		{kmmv1beta2.VerificationSuccess, kmmv1beta2.VerificationStageDone}, {kmmv1beta2.VerificationSuccess, kmmv1beta2.VerificationStageImage},
		{kmmv1beta2.VerificationFailure, kmmv1beta2.VerificationStageDone}, {kmmv1beta2.VerificationInProgress, kmmv1beta2.VerificationStageImage},
	}
	for range rapid.IntRange(0, 5).Draw(t, "modules") {
		e := entry(t)
		c := rapid.SampledFrom(combos).Draw(t, "combo")
		e.VerificationStatus, e.VerificationStage = c[0], c[1]
		pv.Status.Modules = append(pv.Status.Modules, e)
	}
	return pv
}

// TestPreflightValidationRoundTripsFromV1beta1: every valid v1beta1 object converts to a valid
// v1beta2 object and back to itself.
func TestPreflightValidationRoundTripsFromV1beta1(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genV1beta1(t)
		orig := in.DeepCopy()
		hub := &kmmv1beta2.PreflightValidation{}
		if err := in.ConvertTo(hub); err != nil {
			t.Fatal(err)
		}
		for _, m := range hub.Status.Modules {
			if !v1beta2Valid(m.VerificationStatus, m.VerificationStage) {
				t.Fatalf("v1beta2 entry %s/%s: status %q at stage %q is not valid in v1beta2", m.Namespace, m.Name, m.VerificationStatus, m.VerificationStage)
			}
		}
		out := &kmmv1beta1.PreflightValidation{}
		if err := out.ConvertFrom(hub); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(out, orig) || !reflect.DeepEqual(in, orig) {
			t.Fatalf("v1beta1 → v1beta2 → v1beta1 changed the object:\n in %+v\nhub %+v\nout %+v", orig, hub, out)
		}
	})
}

// TestPreflightValidationRoundTripsFromV1beta2: every valid v1beta2 object converts to v1beta1
// and back to itself.
func TestPreflightValidationRoundTripsFromV1beta2(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hub := genV1beta2(t)
		orig := hub.DeepCopy()
		spoke := &kmmv1beta1.PreflightValidation{}
		if err := spoke.ConvertFrom(hub); err != nil {
			t.Fatal(err)
		}
		out := &kmmv1beta2.PreflightValidation{}
		if err := spoke.ConvertTo(out); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(out, orig) || !reflect.DeepEqual(hub, orig) {
			t.Fatalf("v1beta2 → v1beta1 → v1beta2 changed the object:\n in %+v\nv1beta1 %+v\nout %+v", orig, spoke, out)
		}
	})
}

// TestPreflightValidationStatusMapping pins the mapping of the verification status.
func TestPreflightValidationStatusMapping(t *testing.T) {
	for _, tc := range []struct{ v1, stage, v2 string }{
		{kmmv1beta1.VerificationTrue, "Done", kmmv1beta2.VerificationSuccess},
		{kmmv1beta1.VerificationFalse, "Done", kmmv1beta2.VerificationFailure},
		{kmmv1beta1.VerificationFalse, "Image", kmmv1beta2.VerificationInProgress},
	} {
		in := &kmmv1beta1.PreflightValidation{Status: kmmv1beta1.PreflightValidationStatus{Modules: []kmmv1beta1.PreflightValidationModuleStatus{{VerificationStatus: tc.v1, VerificationStage: tc.stage}}}}
		hub := &kmmv1beta2.PreflightValidation{}
		if err := in.ConvertTo(hub); err != nil {
			t.Fatal(err)
		}
		if got := hub.Status.Modules[0].VerificationStatus; got != tc.v2 {
			t.Errorf("v1beta1 %s at stage %s is v1beta2 %s, want %s", tc.v1, tc.stage, got, tc.v2)
		}
	}
}
