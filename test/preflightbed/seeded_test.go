package preflightbed

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/preflight"
)

// TestSeededFaults feeds each checker of TestPreflightValidation and TestAdmission a result with
// one fault seeded into the right one and requires it to report the fault: an assertion that
// cannot fail would pass these by accident.
func TestSeededFaults(t *testing.T) {
	s := &Scenario{NS: "pf", Want: map[string]string{
		"pf/served":        kmmv1beta1.PreflightReasonSuccess,
		"pf/nomapping":     kmmv1beta1.PreflightReasonNoMapping,
		"pf/missing":       kmmv1beta1.PreflightReasonImageMissing,
		"pf/private-right": kmmv1beta1.PreflightReasonSuccess,
		"pf/private-wrong": kmmv1beta1.PreflightReasonUnauthorized,
	}}
	right := func() []preflight.Verdict {
		var vs []preflight.Verdict
		for _, name := range []string{"missing", "nomapping", "private-right", "private-wrong", "served"} {
			reason := s.Want["pf/"+name]
			vs = append(vs, preflight.Verdict{Namespace: "pf", Name: name, Verified: reason == kmmv1beta1.PreflightReasonSuccess,
				Reason: reason, Message: "m", Image: "127.0.0.1:1/kmod/" + name + ":k", Final: true})
		}
		return append(vs, preflight.Verdict{Namespace: "other", Name: "x", Reason: "NoMapping", Message: "m", Final: true})
	}
	if p := s.CheckVerdicts(right()); len(p) != 0 {
		t.Fatalf("the right verdicts are reported: %v", p)
	}
	verdictFaults := map[string]func([]preflight.Verdict) []preflight.Verdict{
		"wrong secret reported as a missing image": func(vs []preflight.Verdict) []preflight.Verdict {
			vs[3].Reason = kmmv1beta1.PreflightReasonImageMissing
			return vs
		},
		"private registry refused with the right secret": func(vs []preflight.Verdict) []preflight.Verdict {
			vs[2].Verified, vs[2].Reason = false, kmmv1beta1.PreflightReasonUnauthorized
			return vs
		},
		"failure verified":  func(vs []preflight.Verdict) []preflight.Verdict { vs[0].Verified = true; return vs },
		"a Module left out": func(vs []preflight.Verdict) []preflight.Verdict { return vs[1:] },
		"a retry taken as final": func(vs []preflight.Verdict) []preflight.Verdict {
			vs[0].Final = false
			return vs
		},
		"no message": func(vs []preflight.Verdict) []preflight.Verdict { vs[1].Message = ""; return vs },
		"a Module of the namespace that is not in the scenario": func(vs []preflight.Verdict) []preflight.Verdict {
			return append(vs, preflight.Verdict{Namespace: "pf", Name: "ghost", Reason: "Success", Verified: true, Final: true, Message: "m"})
		},
	}
	for name, fault := range verdictFaults {
		if p := s.CheckVerdicts(fault(right())); len(p) == 0 {
			t.Errorf("seeded fault %q not caught by CheckVerdicts", name)
		}
	}

	pv := &kmmv1beta2.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	now := metav1.NewTime(time.Unix(1000, 0))
	pv.Status, _, _ = preflight.Status(pv.Status, 2, right(), now)
	if p := s.CheckStatus(pv); len(p) != 0 {
		t.Fatalf("the right status is reported: %v", p)
	}
	stale := pv.DeepCopy()
	stale.Status.ObservedGeneration = 1
	noTime := pv.DeepCopy()
	noTime.Status.Modules[0].LastTransitionTime = metav1.Time{}
	buildStage := pv.DeepCopy()
	buildStage.Status.Modules[0].VerificationStage = "Build"
	for name, bad := range map[string]*kmmv1beta2.PreflightValidation{"stale observedGeneration": stale, "no lastTransitionTime": noTime, "stage not Done": buildStage} {
		if p := s.CheckStatus(bad); len(p) == 0 {
			t.Errorf("seeded fault %q not caught by CheckStatus", name)
		}
	}

	table := "MODULE VERIFIED REASON DETAIL\npf/missing Failure ImageMissing x\npf/nomapping Failure NoMapping x\n" +
		"pf/private-right Success Success x\npf/private-wrong Failure Unauthorized x\npf/served Success Success x\n"
	if p := CheckTable(s, table); len(p) != 0 {
		t.Fatalf("the right table is reported: %v", p)
	}
	for name, bad := range map[string]string{
		"a row with the wrong reason": "pf/missing Failure RegistryUnreachable x\npf/nomapping Failure NoMapping x\npf/private-right Success Success x\npf/private-wrong Failure Unauthorized x\npf/served Success Success x\n",
		"a row missing":               "pf/nomapping Failure NoMapping x\npf/private-right Success Success x\npf/private-wrong Failure Unauthorized x\npf/served Success Success x\n",
		"Success for a failure":       "pf/missing Success ImageMissing x\npf/nomapping Failure NoMapping x\npf/private-right Success Success x\npf/private-wrong Failure Unauthorized x\npf/served Success Success x\n",
		"v1beta1's words":             "pf/missing False ImageMissing x\npf/nomapping False NoMapping x\npf/private-right True Success x\npf/private-wrong False Unauthorized x\npf/served True Success x\n",
	} {
		if p := CheckTable(s, bad); len(p) == 0 {
			t.Errorf("seeded fault %q not caught by CheckTable", name)
		}
	}

	ev := func(kind, name, typ, reason string) eventsv1.Event {
		return eventsv1.Event{Regarding: corev1.ObjectReference{Kind: kind, Name: name}, Type: typ, Reason: reason}
	}
	evs := []eventsv1.Event{ev("PreflightValidation", "upgrade", "Warning", "PreflightNoMapping"), ev("PreflightValidation", "upgrade", "Warning", "PreflightImageMissing")}
	if m := MissingEvents(evs, "upgrade", "PreflightNoMapping", "PreflightImageMissing"); len(m) != 0 {
		t.Fatalf("the right Events are reported missing: %v", m)
	}
	for name, bad := range map[string][]eventsv1.Event{
		"no Event":                   evs[:1],
		"an Event about another PV":  {evs[0], ev("PreflightValidation", "other", "Warning", "PreflightImageMissing")},
		"a Normal Event for failure": {evs[0], ev("PreflightValidation", "upgrade", "Normal", "PreflightImageMissing")},
	} {
		if m := MissingEvents(bad, "upgrade", "PreflightNoMapping", "PreflightImageMissing"); len(m) == 0 {
			t.Errorf("seeded fault %q not caught by MissingEvents", name)
		}
	}

	gk := schema.GroupKind{Group: "kmm.sigs.x-k8s.io", Kind: "PreflightValidation"}
	invalid := apierrors.NewInvalid(gk, "x", field.ErrorList{field.Forbidden(field.NewPath("spec", "pushBuiltImage"), "kmm does not build images")})
	if p := CheckRejected(invalid, "spec.pushBuiltImage", "kmm does not build images"); p != "" {
		t.Fatalf("the right rejection is reported: %s", p)
	}
	for name, err := range map[string]error{
		"accepted":              nil,
		"another kind of error": errors.New("connection refused"),
		"another field named":   apierrors.NewInvalid(gk, "x", field.ErrorList{field.Forbidden(field.NewPath("spec", "kernelVersion"), "kmm does not build images")}),
		"without the message":   apierrors.NewInvalid(gk, "x", field.ErrorList{field.Forbidden(field.NewPath("spec", "pushBuiltImage"), "forbidden")}),
	} {
		if p := CheckRejected(err, "spec.pushBuiltImage", "kmm does not build images"); p == "" {
			t.Errorf("seeded fault %q not caught by CheckRejected", name)
		}
	}
}
