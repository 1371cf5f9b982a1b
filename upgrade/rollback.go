package upgrade

import (
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// rollbackScope is the rollback in force during a step and the previous version it goes back to.
type rollbackScope struct {
	rb       *kmmv1beta1.RolloutRollback
	previous *kmmv1beta1.PreviousVersion
	// version is the Module's version (the one the rollout rolls out).
	version string
}

// covers says whether node n goes back: it is in the rollback (every node for an undo, the listed
// ones for failed nodes) and the previous version has a config for its kernel.
func (rs rollbackScope) covers(n *RolloutNode) bool {
	if rs.rb == nil || rs.previous == nil || rs.rb.Version != rs.previous.Version {
		return false
	}
	if rs.rb.Reason != kmmv1beta1.ReasonRollbackUndo && !slices.Contains(rs.rb.Nodes, n.Name) {
		return false
	}
	return configFor(rs.previous, n.KernelVersion) != nil
}

// configFor is the previous version's config for kernel (nil: none).
func configFor(p *kmmv1beta1.PreviousVersion, kernel string) *kmmv1beta1.PreviousConfig {
	if p == nil {
		return nil
	}
	for i := range p.Configs {
		if p.Configs[i].Config.KernelVersion == kernel {
			return &p.Configs[i]
		}
	}
	return nil
}

// goBack classifies a node a rollback covers (handled false: it is classified as usual): RolledBack
// once its label names the previous version and its pair is Loaded with it, RollingBack while on
// its way (busy: unavailable), and RollingBack with its label to move at once when it is upgrading
// or failed (for failed nodes: whatever its state); an undo moves an Upgraded node later, within
// maxUnavailable, when it is Ready and schedulable (undo). A node without the label, or with another one, is left alone.
func (c *candidates) goBack(p *Progress, n *RolloutNode, label string, done bool, rs rollbackScope) (handled, busy bool) {
	if !rs.covers(n) {
		return false, false
	}
	back := rs.rb.Version
	undo := rs.rb.Reason == kmmv1beta1.ReasonRollbackUndo
	switch {
	case label == back && n.State == kmmv1beta1.StateLoaded && n.LoadedVersion == back:
		p.RolledBack++
		return true, false
	case label == back:
		p.RollingBack++
		c.upgrading = append(c.upgrading, backRow(n))
		return true, true
	case label == "":
		return false, false
	case undo && done:
		if n.Ready && !n.Unschedulable {
			c.undo = append(c.undo, n.Name)
		}
		return false, false
	case undo && !n.startedTowards(label) && label != rs.version:
		// pending with another label: an undo moves the nodes of this rollout only (one that runs
		// the rollout's version but is not verified, its validation failed say, goes back at once)
		return false, false
	}
	p.RollingBack++
	c.back = append(c.back, n.Name)
	c.upgrading = append(c.upgrading, backRow(n))
	return true, true
}

// backRow is the status row of a node going back.
func backRow(n *RolloutNode) kmmv1beta1.RolloutNodeStatus {
	row := kmmv1beta1.RolloutNodeStatus{Name: n.Name, State: kmmv1beta1.RollingBack, PairState: n.State, Reason: n.Reason, Message: n.Message}
	if !n.Since.IsZero() {
		row.Since = &metav1.Time{Time: n.Since}
	}
	return row
}

// decidePrevious is status.rollout.previous: the version the nodes ran before this rollout (the
// last status's version when it names another one; else the one other version the nodes have
// loaded, if there is exactly one) and, one per kernel, at most MaxPreviousConfigs configs nodes
// Loaded with it run, kept from the last status of this version and added to as nodes show them.
func decidePrevious(m *kmmv1beta1.Module, nodes []RolloutNode) *kmmv1beta1.PreviousVersion {
	version := m.Spec.Version()
	var out *kmmv1beta1.PreviousVersion
	switch st := m.Status.Rollout; {
	case st != nil && st.Version == version && st.Previous != nil:
		out = st.Previous.DeepCopy()
	case st != nil && st.Version != version && st.Version != "":
		out = &kmmv1beta1.PreviousVersion{Version: st.Version}
	default:
		v := onlyOtherLoaded(nodes, version)
		if v == "" {
			return nil
		}
		out = &kmmv1beta1.PreviousVersion{Version: v}
	}
	for i := range nodes {
		n := &nodes[i]
		r := n.Running
		if r == nil || n.State != kmmv1beta1.StateLoaded || r.Config.Version != out.Version ||
			len(out.Configs) >= kmmv1beta1.MaxPreviousConfigs || configFor(out, r.Config.KernelVersion) != nil {
			continue
		}
		out.Configs = append(out.Configs, *r.DeepCopy())
	}
	slices.SortFunc(out.Configs, func(a, b kmmv1beta1.PreviousConfig) int {
		return strings.Compare(a.Config.KernelVersion, b.Config.KernelVersion)
	})
	return out
}

// onlyOtherLoaded is the one version other than version that Loaded pairs run ("" when none or
// several).
func onlyOtherLoaded(nodes []RolloutNode, version string) string {
	found := ""
	for i := range nodes {
		n := &nodes[i]
		if n.State != kmmv1beta1.StateLoaded || n.LoadedVersion == "" || n.LoadedVersion == version {
			continue
		}
		if found != "" && found != n.LoadedVersion {
			return ""
		}
		found = n.LoadedVersion
	}
	return found
}

// carriedRollback is the rollback in force at the start of a step, the rollout-undo value
// observed, and why a new undo was refused:
//
//   - the last status's rollback of this version stays, but a resume (a new rollout-resume value)
//     ends it, and a rollback of failed nodes ends with the pause that started it;
//   - a new rollout-undo value starts an undo (every node back to the previous version), refused
//     when no previous version with a config is known.
func carriedRollback(m *kmmv1beta1.Module, previous *kmmv1beta1.PreviousVersion, now time.Time) (rb *kmmv1beta1.RolloutRollback, observedUndo, refused string) {
	version := m.Spec.Version()
	st := m.Status.Rollout
	if st != nil {
		observedUndo = st.ObservedUndo
	}
	if st != nil && st.Version == version && st.Rollback != nil && !resumedNow(m) &&
		previous != nil && st.Rollback.Version == previous.Version {
		rb = st.Rollback.DeepCopy()
		if rb.Reason == kmmv1beta1.ReasonRollbackFailedNodes && !stillPaused(m) {
			rb = nil
		}
	}
	token := annotationToken(m, kmmv1beta1.RolloutUndoAnnotation)
	if token == "" || token == observedUndo {
		return rb, observedUndo, ""
	}
	if previous == nil || previous.Version == version || len(previous.Configs) == 0 {
		return rb, token, "no previous version with a config is known (status.rollout.previous): nothing to go back to; set the Module's version back instead"
	}
	return &kmmv1beta1.RolloutRollback{Version: previous.Version, Reason: kmmv1beta1.ReasonRollbackUndo,
		Since: metav1.NewTime(now).Rfc3339Copy()}, token, ""
}

// resumedNow says whether the rollout-resume annotation has a value the last status has not observed.
func resumedNow(m *kmmv1beta1.Module) bool {
	token := resumeToken(m)
	return token != "" && (m.Status.Rollout == nil || token != m.Status.Rollout.ObservedResume)
}

// stillPaused says whether the pause of the last status goes on (the user's, or the budget's).
func stillPaused(m *kmmv1beta1.Module) bool {
	st := m.Status.Rollout
	return m.Spec.UpgradePolicy.Paused || (st != nil && st.Paused != nil && st.Paused.Reason == kmmv1beta1.ReasonFailureBudgetExceeded)
}

// rollbackFailed adds, with upgradePolicy.rollbackFailed and while the rollout is paused, its
// UpgradeFailed nodes to a rollback of failed nodes (started now if there is none: started), at
// most MaxRollbackNodes; their labels go to the previous version at once (they are unavailable
// already). A failed node whose kernel the previous version has no config for stays, and its
// row says so.
func rollbackFailed(m *kmmv1beta1.Module, st *kmmv1beta1.RolloutStatus, rb *kmmv1beta1.RolloutRollback,
	previous *kmmv1beta1.PreviousVersion, c *candidates, nodes []RolloutNode, now time.Time) (*kmmv1beta1.RolloutRollback, bool) {
	if !m.Spec.UpgradePolicy.RollbackFailed || st.Paused == nil || previous == nil || previous.Version == m.Spec.Version() ||
		(rb != nil && rb.Reason == kmmv1beta1.ReasonRollbackUndo) {
		return rb, false
	}
	started := false
	for i := range c.failed {
		f := &c.failed[i]
		n := nodeNamed(nodes, f.Name)
		if configFor(previous, n.KernelVersion) == nil {
			f.Message += "; not rolled back: status.rollout.previous has no config of " + previous.Version + " for kernel " + n.KernelVersion
			continue
		}
		if rb == nil {
			rb = &kmmv1beta1.RolloutRollback{Version: previous.Version, Reason: kmmv1beta1.ReasonRollbackFailedNodes, Since: metav1.NewTime(now).Rfc3339Copy()}
			started = true
		}
		if slices.Contains(rb.Nodes, f.Name) || len(rb.Nodes) >= kmmv1beta1.MaxRollbackNodes {
			continue
		}
		rb.Nodes = append(rb.Nodes, f.Name)
		c.back = append(c.back, f.Name)
	}
	if rb != nil {
		slices.Sort(rb.Nodes)
	}
	return rb, started
}

// nodeNamed is the node of that name (nodes holds it).
func nodeNamed(nodes []RolloutNode, name string) *RolloutNode {
	for i := range nodes {
		if nodes[i].Name == name {
			return &nodes[i]
		}
	}
	return &RolloutNode{Name: name}
}
