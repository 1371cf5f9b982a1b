package upgrade

import (
	"fmt"
	"math"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// decidePause returns the rollout's new status (without its counters and node list) and whether it
// paused itself in this step:
//
//   - the last status of another version is left behind: a new version starts with a fresh budget
//     and no pause of the budget (changing the version is the user saying so);
//   - a rollout-resume annotation value the last status has not observed resumes a rollout paused
//     at its budget, and the nodes failed at that moment no longer count against it
//     (failedAtResume; it only ever shrinks to the nodes still failed, so a node that recovers and
//     fails again counts);
//   - a pause of the budget stays until then, whatever the nodes do since;
//   - maxFailed nodes failed beyond failedAtResume pause the rollout (PausedNow: its one Event);
//   - else upgradePolicy.paused pauses it, for as long as the user keeps it set.
func decidePause(m *kmmv1beta1.Module, p Progress, failed []kmmv1beta1.RolloutNodeStatus, now time.Time) (*kmmv1beta1.RolloutStatus, bool) {
	version := m.Spec.Version()
	st := &kmmv1beta1.RolloutStatus{Version: version, MaxUnavailable: count32(p.Budget), MaxFailed: count32(p.FailureBudget)}
	var carried *kmmv1beta1.RolloutPause
	prev := m.Status.Rollout
	if prev != nil {
		st.ObservedResume = prev.ObservedResume
	}
	if prev != nil && prev.Version == version {
		st.FailedAtResume = min(prev.FailedAtResume, count32(p.Failed))
		if prev.Paused != nil && prev.Paused.Reason == kmmv1beta1.ReasonFailureBudgetExceeded {
			carried = prev.Paused
		}
	}
	if token := resumeToken(m); token != "" && token != st.ObservedResume {
		st.ObservedResume, st.FailedAtResume, carried = token, count32(p.Failed), nil
	}
	switch {
	case carried != nil:
		st.Paused = carried.DeepCopy()
	case p.FailureBudget > 0 && count32(p.Failed)-st.FailedAtResume >= count32(p.FailureBudget):
		st.Paused = &kmmv1beta1.RolloutPause{Reason: kmmv1beta1.ReasonFailureBudgetExceeded,
			Message: budgetMessage(p, st.FailedAtResume, failed), Since: metav1.NewTime(now).Rfc3339Copy()}
		return st, true
	case m.Spec.UpgradePolicy.Paused:
		st.Paused = &kmmv1beta1.RolloutPause{Reason: kmmv1beta1.ReasonPausedByUser,
			Message: "upgradePolicy.paused is true: no node starts (kubectl kmm rollout resume)", Since: metav1.NewTime(now).Rfc3339Copy()}
		if prev != nil && prev.Paused != nil && prev.Paused.Reason == kmmv1beta1.ReasonPausedByUser {
			st.Paused.Since = prev.Paused.Since
		}
	}
	return st, false
}

// resumeToken is the Module's rollout-resume annotation, at most MaxRolloutResumeLength characters of it.
func resumeToken(m *kmmv1beta1.Module) string {
	return annotationToken(m, kmmv1beta1.RolloutResumeAnnotation)
}

// annotationToken is the Module's annotation key, at most MaxRolloutResumeLength characters of it.
func annotationToken(m *kmmv1beta1.Module, key string) string {
	v := m.Annotations[key]
	return v[:min(len(v), kmmv1beta1.MaxRolloutResumeLength)]
}

// maxNodesInMessage bounds the failed nodes a pause message names.
const maxNodesInMessage = 5

// budgetMessage says how many nodes failed against which budget, names the first failed nodes
// with their reasons, and what to do.
func budgetMessage(p Progress, atResume int32, failed []kmmv1beta1.RolloutNodeStatus) string {
	names := make([]string, 0, min(len(failed), maxNodesInMessage))
	for _, f := range failed[:min(len(failed), maxNodesInMessage)] {
		names = append(names, f.Name+" ("+f.Reason+")")
	}
	if len(failed) > maxNodesInMessage {
		names = append(names, fmt.Sprintf("and %d more", len(failed)-maxNodesInMessage))
	}
	beyond := ""
	if atResume > 0 {
		beyond = fmt.Sprintf(" (%d of them already failed at the last resume)", atResume)
	}
	return fmt.Sprintf("%d of %d nodes UpgradeFailed%s, maxFailed is %d: %s; fix them (or label them upgrade-skip), "+
		"then kubectl kmm rollout resume, or change the version", p.Failed, p.Total, beyond, p.FailureBudget, strings.Join(names, ", "))
}

// count32 is a node count as the status stores it.
func count32(n int) int32 {
	return int32(max(min(n, math.MaxInt32), 0))
}
