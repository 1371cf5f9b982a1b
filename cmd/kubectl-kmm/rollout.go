package main

import (
	"fmt"
	"strings"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// renderRollout is `rollout status`'s text: a summary of the Module's status.rollout (version,
// pause, budgets, nodes per upgrade state) and a table of its listed nodes, failed first.
func renderRollout(m *kmmv1beta1.Module, now time.Time, width int) string {
	var b strings.Builder
	st := m.Status.Rollout
	name := m.Namespace + "/" + m.Name
	if st == nil {
		return name + ": no rollout status yet (the operator has not looked at this Module's rollout)\n"
	}
	state := "rolling out"
	if st.NodesByUpgradeState[kmmv1beta1.Upgraded] > 0 && onlyUpgradedOrSkipped(st) {
		state = "complete"
	}
	fmt.Fprintf(&b, "%s: %s %s", name, state, st.Version)
	if st.Version != m.Spec.Version() {
		fmt.Fprintf(&b, " (the Module asks for %s; the operator has not caught up)", m.Spec.Version())
	}
	b.WriteString("\n")
	if p := st.Paused; p != nil {
		fmt.Fprintf(&b, "PAUSED (%s, %s): %s\n", p.Reason, age(p.Since.Time, now), p.Message)
	}
	fmt.Fprintf(&b, "maxUnavailable %d, maxFailed %s", st.MaxUnavailable, failedBudget(st))
	b.WriteString("\n")
	counts := make([]string, 0, len(upgradeStates))
	for _, s := range upgradeStates {
		counts = append(counts, fmt.Sprintf("%s %d", s, st.NodesByUpgradeState[s]))
	}
	b.WriteString(strings.Join(counts, ", ") + "\n")
	if len(st.Nodes) == 0 {
		return b.String()
	}
	b.WriteString("\n")
	t := &table{headers: []string{"NODE", "UPGRADE STATE", "PAIR STATE", "AGE", "REASON"}, caps: []int{40, 0, 0, 0}, width: width, minLast: 20}
	for _, n := range st.Nodes {
		since := ""
		if n.Since != nil {
			since = age(n.Since.Time, now)
		}
		reason := n.Reason
		if n.Message != "" {
			reason += ": " + n.Message
		}
		t.add(n.Name, string(n.State), string(n.PairState), since, reason)
	}
	_ = t.write(&b)
	if listed, total := len(st.Nodes), int(st.NodesByUpgradeState[kmmv1beta1.UpgradeFailed]+st.NodesByUpgradeState[kmmv1beta1.Upgrading]); listed < total {
		fmt.Fprintf(&b, "(%d more not listed: status.rollout lists at most %d nodes)\n", total-listed, kmmv1beta1.MaxRolloutNodesListed)
	}
	return b.String()
}

// upgradeStates in the order `rollout status` counts them.
var upgradeStates = []kmmv1beta1.UpgradeState{kmmv1beta1.Upgraded, kmmv1beta1.Upgrading, kmmv1beta1.UpgradeFailed,
	kmmv1beta1.UpgradePending, kmmv1beta1.UpgradeSkipped}

// onlyUpgradedOrSkipped says whether every node counted is Upgraded or UpgradeSkipped.
func onlyUpgradedOrSkipped(st *kmmv1beta1.RolloutStatus) bool {
	for s, n := range st.NodesByUpgradeState {
		if n > 0 && s != kmmv1beta1.Upgraded && s != kmmv1beta1.UpgradeSkipped {
			return false
		}
	}
	return true
}

// failedBudget says the failure budget and how much of it is spent.
func failedBudget(st *kmmv1beta1.RolloutStatus) string {
	failed := st.NodesByUpgradeState[kmmv1beta1.UpgradeFailed]
	if st.MaxFailed == 0 {
		return fmt.Sprintf("none (%d failed)", failed)
	}
	s := fmt.Sprintf("%d (%d failed", st.MaxFailed, failed)
	if st.FailedAtResume > 0 {
		s += fmt.Sprintf(", %d of them already at the last resume", st.FailedAtResume)
	}
	return s + ")"
}
