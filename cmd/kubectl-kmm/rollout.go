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
	writeRolloutSummary(&b, m, st, now)
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
	if listed, total := len(st.Nodes), int(st.NodesByUpgradeState[kmmv1beta1.UpgradeFailed]+st.NodesByUpgradeState[kmmv1beta1.Upgrading]+
		st.NodesByUpgradeState[kmmv1beta1.RollingBack]); listed < total {
		fmt.Fprintf(&b, "(%d more not listed: status.rollout lists at most %d nodes)\n", total-listed, kmmv1beta1.MaxRolloutNodesListed)
	}
	return b.String()
}

// upgradeStates in the order `rollout status` counts them.
var upgradeStates = []kmmv1beta1.UpgradeState{kmmv1beta1.Upgraded, kmmv1beta1.Upgrading, kmmv1beta1.UpgradeFailed,
	kmmv1beta1.UpgradePending, kmmv1beta1.UpgradeSkipped}

// writeRolloutSummary writes the rollback, budgets, canary, previous version and counts lines.
func writeRolloutSummary(b *strings.Builder, m *kmmv1beta1.Module, st *kmmv1beta1.RolloutStatus, now time.Time) {
	if rb := st.Rollback; rb != nil {
		fmt.Fprintf(b, "ROLLING BACK to %s (%s, %s): %s\n", rb.Version, rb.Reason, age(rb.Since.Time, now), rollbackScope(rb))
	}
	fmt.Fprintf(b, "maxUnavailable %d, maxFailed %s\n", st.MaxUnavailable, failedBudget(st))
	if c := st.Canary; c != nil {
		b.WriteString(canaryLine(m, c, now) + "\n")
	}
	if p := st.Previous; p != nil {
		fmt.Fprintf(b, "previous version %s (%d kernel configs kept for a rollback)\n", p.Version, len(p.Configs))
	}
	counts := make([]string, 0, len(upgradeStates)+len(rollbackStates))
	for _, s := range upgradeStates {
		counts = append(counts, fmt.Sprintf("%s %d", s, st.NodesByUpgradeState[s]))
	}
	for _, s := range rollbackStates {
		if n := st.NodesByUpgradeState[s]; n > 0 {
			counts = append(counts, fmt.Sprintf("%s %d", s, n))
		}
	}
	b.WriteString(strings.Join(counts, ", ") + "\n")
}

// rollbackStates are the upgrade states `rollout status` counts only when some node is in them.
var rollbackStates = []kmmv1beta1.UpgradeState{kmmv1beta1.CanaryWaiting, kmmv1beta1.RollingBack, kmmv1beta1.RolledBack}

// rollbackScope says which nodes a rollback moves.
func rollbackScope(rb *kmmv1beta1.RolloutRollback) string {
	if rb.Reason == kmmv1beta1.ReasonRollbackUndo {
		return "every node goes back, maxUnavailable at a time (kubectl kmm rollout undo); no node starts towards the version"
	}
	return fmt.Sprintf("the failed nodes %s go back (upgradePolicy.rollbackFailed) while the rollout is paused", strings.Join(rb.Nodes, ", "))
}

// canaryLine says the canary nodes and where their soak stands.
func canaryLine(m *kmmv1beta1.Module, c *kmmv1beta1.CanaryStatus, now time.Time) string {
	nodes := strings.Join(c.Nodes, ", ")
	if nodes == "" {
		nodes = "none chosen yet (no managed node matches canary.nodeSelector)"
	}
	soak := time.Duration(0)
	if p := m.Spec.UpgradePolicy; p != nil && p.Canary != nil {
		soak = time.Duration(p.Canary.SoakSeconds) * time.Second
	}
	switch {
	case c.Passed:
		return "canary " + nodes + ": passed"
	case c.SoakStart != nil:
		return fmt.Sprintf("canary %s: soaking since %s (%s of %s); the other nodes wait", nodes, age(c.SoakStart.Time, now),
			now.Sub(c.SoakStart.Time).Truncate(time.Second), soak)
	}
	return "canary " + nodes + ": upgrading; the other nodes wait until they have run the version for " + soak.String()
}

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
