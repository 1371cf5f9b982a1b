package preflight

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
)

// maxMessage is the longest statusReason written (the schema's bound).
const maxMessage = 1024

// Status is the PreflightValidation status for verdicts (sorted by namespace and name), computed
// from the stored one: an entry keeps its lastTransitionTime while its verification status and
// reason stay the same. At most kmmv1beta2.MaxPreflightModules entries are written; left says how
// many verdicts did not fit. Changed lists the verdicts whose status or reason differ from the
// stored entry (new Modules included): those that get an Event.
func Status(old kmmv1beta2.PreflightValidationStatus, generation int64, verdicts []Verdict, now metav1.Time) (st kmmv1beta2.PreflightValidationStatus, changed []Verdict, left int) {
	prev := make(map[string]kmmv1beta2.PreflightValidationModuleStatus, len(old.Modules))
	for _, e := range old.Modules {
		prev[e.Namespace+"/"+e.Name] = e
	}
	if len(verdicts) > kmmv1beta2.MaxPreflightModules {
		left = len(verdicts) - kmmv1beta2.MaxPreflightModules
		verdicts = verdicts[:kmmv1beta2.MaxPreflightModules]
	}
	st.ObservedGeneration = generation
	st.Modules = make([]kmmv1beta2.PreflightValidationModuleStatus, 0, len(verdicts))
	for _, v := range verdicts {
		e := entry(v, now)
		if p, ok := prev[v.Key()]; ok && p.VerificationStatus == e.VerificationStatus && p.Reason == e.Reason {
			e.LastTransitionTime = p.LastTransitionTime
		} else {
			changed = append(changed, v)
		}
		st.Modules = append(st.Modules, e)
	}
	return st, changed, left
}

// entry is the status entry of one verdict: Success, InProgress while the check is retried (stage
// Image), else Failure (stage Done).
func entry(v Verdict, now metav1.Time) kmmv1beta2.PreflightValidationModuleStatus {
	e := kmmv1beta2.PreflightValidationModuleStatus{
		Namespace:          v.Namespace,
		Name:               v.Name,
		VerificationStatus: kmmv1beta2.VerificationFailure,
		VerificationStage:  kmmv1beta2.VerificationStageDone,
		Reason:             v.Reason,
		StatusReason:       truncate(v.Message, maxMessage),
		Image:              truncate(v.Image, maxMessage),
		LastTransitionTime: now,
	}
	if !v.Final {
		e.VerificationStatus, e.VerificationStage = kmmv1beta2.VerificationInProgress, kmmv1beta2.VerificationStageImage
	}
	if v.Verified {
		e.VerificationStatus = kmmv1beta2.VerificationSuccess
	}
	return e
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}

// VerdictOf reads a verdict back from a status entry (for printing a stored PreflightValidation).
func VerdictOf(e kmmv1beta2.PreflightValidationModuleStatus) Verdict {
	return Verdict{
		Namespace: e.Namespace, Name: e.Name, Verified: e.VerificationStatus == kmmv1beta2.VerificationSuccess,
		Reason: e.Reason, Message: e.StatusReason, Image: e.Image, Final: e.VerificationStage == kmmv1beta2.VerificationStageDone,
	}
}
