package upgrade

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// RolloutInput is everything the automatic rollout of spec.upgradePolicy decides from, gathered
// by the reconciler before deciding.
type RolloutInput struct {
	// Module is the Module being rolled out: its namespace and name (label keys), version and
	// upgradePolicy are read.
	Module *kmmv1beta1.Module
	// Nodes are the nodes the Module's selector matches.
	Nodes []RolloutNode
	// Now is the time of the decision (the node timeout and the drain timeout count up to it).
	Now time.Time

	// staleValidations are validation pods of other versions, which the reconciler deletes.
	staleValidations []*corev1.Pod
}

// RolloutNode is what the rollout reads of one selected node and its (node, Module) pair.
type RolloutNode struct {
	// Name of the node.
	Name string
	// Labels of the node (the version-module and upgrade-skip labels are read).
	Labels map[string]string
	// Ready is the node's Ready condition.
	Ready bool
	// Unschedulable is spec.unschedulable: the node is cordoned.
	Unschedulable bool
	// State is the pair's state from the NMC status ("" when there is no status entry).
	State kmmv1beta1.ModuleState
	// LoadedVersion is the version of the config in the pair's NMC status ("" when none).
	LoadedVersion string
	// CordonedByKMM: the pair's drain record says the node's cordon is kmm's.
	CordonedByKMM bool
	// Reason and Message are the pair's last status reason and message.
	Reason, Message string
	// Since is when the pair entered its state (zero when there is no status entry).
	Since time.Time
	// DrainStart is when the pair's upgrade drain started (zero when it has no drain record).
	DrainStart time.Time
	// DevicePluginPending: the Module has a device plugin or DRA driver and no Ready pod of it is on
	// the node (zero: nothing to wait for).
	DevicePluginPending bool
	// Validation is the node's validation pod for the Module's version (zero: none).
	Validation ValidationPod
	// KernelVersion is the node's kernel (status.nodeInfo.kernelVersion): a rollback loads the
	// previous version's config for it.
	KernelVersion string
	// Running is the config in the pair's NMC status with the worker pod settings that loaded it
	// (nil when none): what status.rollout.previous records of the previous version.
	Running *kmmv1beta1.PreviousConfig
}

// ValidationPhase is what became of a validation pod.
type ValidationPhase string

// The validation pod phases the rollout distinguishes.
const (
	ValidationNone      ValidationPhase = ""
	ValidationRunning   ValidationPhase = "Running"
	ValidationSucceeded ValidationPhase = "Succeeded"
	ValidationFailed    ValidationPhase = "Failed"
)

// ValidationPod is a node's validation pod as observed.
type ValidationPod struct {
	Phase ValidationPhase
	// Message is, for a failed pod, its container's termination message or log tail.
	Message string
}

// verified says whether a node that runs its label's version is through: its device plugin (or
// DRA driver) pod is Ready, and its validation pod, if the Module has one, succeeded.
func (n *RolloutNode) verified(policy *kmmv1beta1.UpgradePolicy) bool {
	return !n.DevicePluginPending && (policy.Validation == nil || n.Validation.Phase == ValidationSucceeded)
}

// startedTowards says whether the node's pair is on its way to the version label: it drains or
// unloads another version for it (or has unloaded it), or kmm cordoned the node for it. A reload of
// the label's own version after a reboot, or a first load, is not.
func (n *RolloutNode) startedTowards(label string) bool {
	return n.State == kmmv1beta1.StateUpgrading || n.CordonedByKMM || (n.LoadedVersion != "" && n.LoadedVersion != label)
}

// runs says whether the node's pair is Loaded with version.
func (n *RolloutNode) runs(version string) bool {
	return n.State == kmmv1beta1.StateLoaded && n.LoadedVersion == version
}

// leaving says whether the node's pair drains or unloads the version it runs: a node sent back
// while it started to leave its version, and left there by the end of the rollback, is unavailable
// until its pair is Loaded again.
func (n *RolloutNode) leaving() bool {
	return n.State == kmmv1beta1.StateDevicePluginDraining || n.State == kmmv1beta1.StateUnloading || n.State == kmmv1beta1.StateUnloadBackOff
}

// Intent asks to set the version-module label of Node to Version.
type Intent struct {
	Node    string
	Version string
}

// Progress is the classification of the selected nodes behind a plan.
type Progress struct {
	// Total counts the nodes the rollout manages (selected, not skipped).
	Total int
	// Done, InProgress, Pending, RollingBack and RolledBack partition the managed nodes.
	Done, InProgress, Pending int
	// Unavailable counts in-progress nodes plus cordoned or NotReady nodes, done or not.
	Unavailable int
	// Budget is maxUnavailable resolved against Total.
	Budget int
	// Failed counts the in-progress nodes that are UpgradeFailed (they are in InProgress too).
	Failed int
	// FailureBudget is maxFailed resolved against Total (0: none).
	FailureBudget int
	// Skipped counts the selected nodes with the upgrade-skip label.
	Skipped int
	// RollingBack and RolledBack count the nodes of a rollback (status.rollout.rollback) on their
	// way back to the previous version and running it; they are not in Done, InProgress or Pending.
	RollingBack, RolledBack int
	// CanaryWaiting counts the pending nodes that are not canaries while the canaries have not
	// soaked (they are in Pending too).
	CanaryWaiting int
}

// Complete says whether every managed node runs the Module's version.
func (p Progress) Complete() bool {
	return p.Done == p.Total
}

// PlanRollout is DecideRollout's intents and classification.
func PlanRollout(in RolloutInput) ([]Intent, Progress) {
	d := DecideRollout(in)
	return d.Intents, d.Progress
}

// RolloutDecision is what one rollout step decides.
type RolloutDecision struct {
	// Intents are the version-module labels to set.
	Intents []Intent
	// Progress is the classification of the selected nodes behind them.
	Progress Progress
	// Status is the Module's new status.rollout (nil when the Module is not rolled out automatically).
	Status *kmmv1beta1.RolloutStatus
	// PausedNow: this step paused the rollout at its failure budget (the one Event of the pause).
	PausedNow bool
	// NewlyFailed are the nodes UpgradeFailed now that the last status did not list as failed.
	NewlyFailed []kmmv1beta1.RolloutNodeStatus
	// Validate are the nodes whose validation pod for the version is to be created.
	Validate []string
	// UndoRefused says why a new rollout-undo annotation could not roll back (one Event); "" when
	// none was refused.
	UndoRefused string
	// RollbackStarted: this step started a rollback (one Event).
	RollbackStarted bool
	// OldestSince is, per upgrade state of moving nodes (Upgrading, UpgradeFailed, RollingBack),
	// when the pair longest in its state entered it (a node Loaded with another version than its
	// label, whose upgrade has not reached its pair, aside).
	OldestSince map[kmmv1beta1.UpgradeState]time.Time
	// SoakEnds is when the canaries' soak ends, while they soak (zero otherwise): the rollout
	// looks again then.
	SoakEnds time.Time
}

// DecideRollout returns the version-module labels to set, the classification of the selected nodes
// behind them and the rollout's status, so that the rollout advances without more than
// maxUnavailable nodes unavailable at once and stops at its failure budget:
//
//   - nothing unless upgradePolicy.automatic is true and the Module has a version (and is not
//     being deleted);
//   - nodes with the upgrade-skip label are never touched and do not count anywhere;
//   - a node is done when its label equals the version, its pair is Loaded with that version, its
//     device plugin (or DRA driver) pod is Ready if the Module has one, and its validation pod
//     succeeded if the Module has one (a node that got that far without a validation pod gets
//     one: Validate), in progress when its label equals the version but it is not done, or when it started
//     towards the version its label names and the Module has since left (startedTowards), and
//     pending otherwise
//     (a missing label is adopted: it is set like any other);
//   - an in-progress node is UpgradeFailed (failure) while its pair backs off after a failed load
//     or unload, once its validation pod failed, once its drain ran every strategy and pods remain,
//     or once its pair stayed in one state (but Loaded with another version than its label) for
//     nodeTimeoutSeconds; it stays in progress, and unavailable;
//   - unavailable = in-progress nodes + cordoned or NotReady nodes (done ones too: a cordon kmm
//     has not lifted yet, or a node that went NotReady after its upgrade, is unavailable all the
//     same), and pending nodes whose pair drains or unloads (leaving);
//   - a node in progress to a version the Module no longer has (a bump during the rollout) is
//     retargeted at once: it is unavailable already, and kmm's own cordon would otherwise keep it
//     from ever starting again;
//   - the rollout is paused (decidePause) by the user (upgradePolicy.paused), or by itself once
//     maxFailed nodes beyond those failed at the last resume are UpgradeFailed, until the user
//     resumes it or the version changes; a paused rollout starts no node (retargets still go);
//   - with upgradePolicy.canary, only the canary nodes (chooseCanary) start until every one of
//     them has been done for soakSeconds; the others are CanaryWaiting;
//   - a rollback (rollback.go: the failed nodes of a paused rollout with rollbackFailed, or every
//     node after kubectl kmm rollout undo) sends its nodes' labels back to status.rollout.previous's
//     version — the upgrading and failed ones at once, the upgraded ones of an undo within the
//     budget — and starts no node towards the version while it lasts;
//   - else at most budget − unavailable pending nodes start, by name; a cordoned or NotReady
//     pending node never starts.
func DecideRollout(in RolloutInput) RolloutDecision {
	m := in.Module
	if m == nil || !automatic(m) {
		return RolloutDecision{}
	}
	version := m.Spec.Version()
	previous := decidePrevious(m, in.Nodes)
	rb, observedUndo, refused := carriedRollback(m, previous, in.Now)
	canary := chooseCanary(m, in.Nodes)
	p, c := classify(m, in.Nodes, in.Now, rollbackScope{rb, previous, version}, canary)
	p.Budget = budget(m.Spec.UpgradePolicy.MaxUnavailable, p.Total)
	p.FailureBudget = failureBudget(m.Spec.UpgradePolicy.MaxFailed, p.Total)
	d := RolloutDecision{Progress: p, UndoRefused: refused}
	slices.SortFunc(c.failed, byName)
	d.Status, d.PausedNow = decidePause(m, p, c.failed, in.Now)
	undoStarted := rb != nil && rb.Reason == kmmv1beta1.ReasonRollbackUndo && observedUndo != priorUndo(m)
	rb, d.RollbackStarted = rollbackFailed(m, d.Status, rb, previous, &c, in.Nodes, in.Now)
	d.RollbackStarted = d.RollbackStarted || undoStarted
	d.OldestSince = oldestSince(in.Nodes, append(slices.Clone(c.failed), c.upgrading...), m)
	nodes := listed(c.failed, c.upgrading) // sorts both by name
	d.Status.NodesByUpgradeState = countStates(p)
	d.Status.Nodes = nodes
	d.Status.Previous, d.Status.Rollback, d.Status.ObservedUndo = previous, rb, observedUndo
	d.Status.Canary = canary.status(c.canaryDone, in.Now)
	if cs := d.Status.Canary; cs != nil && !cs.Passed && cs.SoakStart != nil {
		d.SoakEnds = cs.SoakStart.Add(time.Duration(m.Spec.UpgradePolicy.Canary.SoakSeconds) * time.Second)
	}
	d.NewlyFailed = newlyFailed(m.Status.Rollout, version, c.failed)
	d.Validate = c.validate

	d.Intents = intentsOf(version, c.retarget, nil)
	if rb != nil {
		d.Intents = intentsOf(rb.Version, c.back, d.Intents)
	}
	d.Intents = intentsOf(startVersion(version, rb), starts(p, c, rb, d.Status, canary.passed(c.canaryDone, in.Now)), d.Intents)
	return d
}

// starts are the pending nodes that start this step, by name: none while paused (but for an
// undo, whose upgraded nodes go back), only canaries until they soaked, at most budget −
// unavailable of them.
func starts(p Progress, c candidates, rb *kmmv1beta1.RolloutRollback, st *kmmv1beta1.RolloutStatus, canaryPassed bool) []string {
	out := c.pending
	switch {
	case rb != nil && rb.Reason == kmmv1beta1.ReasonRollbackUndo:
		out = c.undo
	case rb != nil || st.Paused != nil:
		return nil
	case !canaryPassed:
		out = c.canaryPending
	}
	out = slices.Sorted(slices.Values(out))
	return out[:min(max(p.Budget-p.Unavailable, 0), len(out))]
}

// startVersion is the version a starting node goes to: the previous one during an undo.
func startVersion(version string, rb *kmmv1beta1.RolloutRollback) string {
	if rb != nil && rb.Reason == kmmv1beta1.ReasonRollbackUndo {
		return rb.Version
	}
	return version
}

// intentsOf appends an intent to version for each node, by name.
func intentsOf(version string, nodes []string, out []Intent) []Intent {
	for _, name := range slices.Sorted(slices.Values(nodes)) {
		out = append(out, Intent{Node: name, Version: version})
	}
	return out
}

// candidates are the nodes a rollout may label (pending nodes that may start, Ready and
// schedulable, and nodes in progress to a version the Module no longer has) and the nodes it lists
// in its status.
type candidates struct {
	pending, retarget, validate []string
	failed, upgrading           []kmmv1beta1.RolloutNodeStatus
	// back are the nodes of a rollback whose label goes to the previous version at once (they are
	// unavailable already); undo are the upgraded ones an undo moves back within maxUnavailable.
	back, undo []string
	// canaryPending are the pending canary nodes; canaryDone says whether every canary is Upgraded.
	canaryPending []string
	canaryDone    bool
}

// classify counts the managed nodes as done, in progress (failed or not), pending or going back,
// and returns the nodes that may be labelled and those listed.
func classify(m *kmmv1beta1.Module, nodes []RolloutNode, now time.Time, rs rollbackScope, cn canaryChoice) (Progress, candidates) {
	skipKey := kmmv1beta1.UpgradeSkipLabel(m.Namespace, m.Name)
	var p Progress
	c := candidates{canaryDone: true}
	for i := range nodes {
		n := &nodes[i]
		if _, skip := n.Labels[skipKey]; skip {
			p.Skipped++
			continue
		}
		p.Total++
		if c.classifyNode(&p, m, n, now, rs, cn) {
			p.Unavailable++
		}
	}
	return p, c
}

// classifyNode files one managed node and says whether it is unavailable.
func (c *candidates) classifyNode(p *Progress, m *kmmv1beta1.Module, n *RolloutNode, now time.Time, rs rollbackScope, cn canaryChoice) bool {
	version := m.Spec.Version()
	label, hasLabel := n.Labels[kmmv1beta1.ModuleVersionLabel(m.Namespace, m.Name)]
	unavailable := !n.Ready || n.Unschedulable || n.leaving()
	done := hasLabel && label == version && n.runs(label) && n.verified(m.Spec.UpgradePolicy)
	if cn.is(n.Name) && !done {
		c.canaryDone = false
	}
	if handled, busy := c.goBack(p, n, label, done, rs); handled {
		return unavailable || busy
	}
	switch {
	case done:
		p.Done++
	case hasLabel && label == version:
		p.InProgress++
		c.inProgress(p, n, label, m.Spec.UpgradePolicy, now)
		return true
	case hasLabel && n.startedTowards(label):
		p.InProgress++
		c.retarget = append(c.retarget, n.Name)
		c.inProgress(p, n, label, m.Spec.UpgradePolicy, now)
		return true
	default:
		p.Pending++
		c.pend(p, n.Name, unavailable, cn)
	}
	return unavailable
}

// pend files a pending node: a candidate to start when available, a canary candidate when it is
// one, and CanaryWaiting when the rollout has canaries and it is not one.
func (c *candidates) pend(p *Progress, name string, unavailable bool, cn canaryChoice) {
	if cn.active() && !cn.is(name) {
		p.CanaryWaiting++
	}
	if unavailable {
		return
	}
	c.pending = append(c.pending, name)
	if cn.is(name) {
		c.canaryPending = append(c.canaryPending, name)
	}
}

// inProgress lists an in-progress node as failed or upgrading.
func (c *candidates) inProgress(p *Progress, n *RolloutNode, label string, policy *kmmv1beta1.UpgradePolicy, now time.Time) {
	row := kmmv1beta1.RolloutNodeStatus{Name: n.Name, State: kmmv1beta1.Upgrading, PairState: n.State, Reason: n.Reason, Message: n.Message}
	if !n.Since.IsZero() {
		row.Since = &metav1.Time{Time: n.Since}
	}
	reason, message, failed := n.failure(label, policy, now)
	if !failed {
		c.upgrading = append(c.upgrading, c.verifying(n, label, policy, row))
		return
	}
	p.Failed++
	row.State, row.Reason, row.Message = kmmv1beta1.UpgradeFailed, reason, message
	c.failed = append(c.failed, row)
}

// verifying is the row of an upgrading node that runs its label's version but is not verified yet:
// it waits for its device plugin pod, or for its validation pod (to be created when it has none).
func (c *candidates) verifying(n *RolloutNode, label string, policy *kmmv1beta1.UpgradePolicy, row kmmv1beta1.RolloutNodeStatus) kmmv1beta1.RolloutNodeStatus {
	if n.State != kmmv1beta1.StateLoaded || n.LoadedVersion != label {
		return row
	}
	switch {
	case n.DevicePluginPending:
		row.Reason, row.Message = kmmv1beta1.ReasonDevicePluginNotReady, "loaded; waiting for the device plugin (or DRA driver) pod to be Ready"
	case policy.Validation != nil:
		row.Reason, row.Message = kmmv1beta1.ReasonValidating, "loaded; the validation pod runs"
		if n.Validation.Phase == ValidationNone {
			c.validate = append(c.validate, n.Name)
			row.Message = "loaded; the validation pod is being created"
		}
	}
	return row
}

// failure says whether an in-progress node is UpgradeFailed, and why: its validation pod failed
// (ValidationFailed), its pair backs off after a failed worker (the pair's reason and message), its
// drain ran every strategy and pods remain (DrainTimedOut), or its pair stayed in one state for
// nodeTimeoutSeconds (UpgradeTimedOut), but Loaded with another version than its label (its
// upgrade has not started).
func (n *RolloutNode) failure(label string, policy *kmmv1beta1.UpgradePolicy, now time.Time) (reason, message string, failed bool) {
	switch {
	case n.State == kmmv1beta1.StateLoaded && n.LoadedVersion == label && n.Validation.Phase == ValidationFailed:
		return kmmv1beta1.ReasonValidationFailed, "the validation pod failed: " + n.Validation.Message, true
	case n.State == kmmv1beta1.StateLoadBackOff || n.State == kmmv1beta1.StateUnloadBackOff:
		if n.Message == "" {
			return n.Reason, "the pair backs off in " + string(n.State), true
		}
		return n.Reason, n.Message, true
	case n.drainTimedOut(policy.Drain, now):
		return kmmv1beta1.ReasonDrainTimedOut, "every drain strategy ran since " + n.DrainStart.UTC().Format(time.RFC3339) +
			" and workload pods remain on the node", true
	case n.timedOut(label, policy.NodeTimeoutSeconds, now):
		return kmmv1beta1.ReasonUpgradeTimedOut, "the pair has been " + string(n.State) + " since " +
			n.Since.UTC().Format(time.RFC3339) + ", longer than nodeTimeoutSeconds", true
	}
	return "", "", false
}

// drainTimedOut says whether the pair still drains once every strategy of drain ran.
func (n *RolloutNode) drainTimedOut(drain *kmmv1beta1.DrainSpec, now time.Time) bool {
	return n.State == kmmv1beta1.StateDevicePluginDraining && drain != nil && !n.DrainStart.IsZero() &&
		!now.Before(n.DrainStart.Add(drainGiveUp(drain)))
}

// timedOut says whether the pair stayed in its state for timeoutSeconds (0: never), unless it is
// Loaded with another version than the label (its upgrade has not started).
func (n *RolloutNode) timedOut(label string, timeoutSeconds int32, now time.Time) bool {
	notStarted := n.State == kmmv1beta1.StateLoaded && n.LoadedVersion != label
	return timeoutSeconds > 0 && !notStarted && !n.Since.IsZero() &&
		!now.Before(n.Since.Add(time.Duration(timeoutSeconds)*time.Second))
}

// drainGiveUp is when a drain has run every strategy it will (fsm's planDrain says TimedOut then):
// the later of timeoutSeconds and expectedDrainSeconds + pdbForceDrainTimeoutSeconds, after
// jobs.waitSeconds with drain.jobs (DrainSpec.GiveUp).
func drainGiveUp(d *kmmv1beta1.DrainSpec) time.Duration {
	return d.GiveUp()
}

// countStates is status.rollout.nodesByUpgradeState.
func countStates(p Progress) map[kmmv1beta1.UpgradeState]int32 {
	out := map[kmmv1beta1.UpgradeState]int32{}
	for state, n := range map[kmmv1beta1.UpgradeState]int{
		kmmv1beta1.UpgradePending: p.Pending - p.CanaryWaiting, kmmv1beta1.Upgrading: p.InProgress - p.Failed, kmmv1beta1.Upgraded: p.Done,
		kmmv1beta1.UpgradeFailed: p.Failed, kmmv1beta1.UpgradeSkipped: p.Skipped,
		kmmv1beta1.RollingBack: p.RollingBack, kmmv1beta1.RolledBack: p.RolledBack, kmmv1beta1.CanaryWaiting: p.CanaryWaiting,
	} {
		if n > 0 {
			out[state] = count32(n)
		}
	}
	return out
}

// listed is status.rollout.nodes: failed nodes, then upgrading ones, each by name, at most
// MaxRolloutNodesListed.
func listed(failed, upgrading []kmmv1beta1.RolloutNodeStatus) []kmmv1beta1.RolloutNodeStatus {
	slices.SortFunc(failed, byName)
	slices.SortFunc(upgrading, byName)
	out := append(slices.Clone(failed), upgrading...)
	if len(out) == 0 {
		return nil
	}
	return out[:min(len(out), kmmv1beta1.MaxRolloutNodesListed)]
}

// oldestSince is RolloutDecision.OldestSince from the rows of the moving nodes.
func oldestSince(nodes []RolloutNode, rows []kmmv1beta1.RolloutNodeStatus, m *kmmv1beta1.Module) map[kmmv1beta1.UpgradeState]time.Time {
	labelKey := kmmv1beta1.ModuleVersionLabel(m.Namespace, m.Name)
	byName := make(map[string]*RolloutNode, len(nodes))
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	out := map[kmmv1beta1.UpgradeState]time.Time{}
	for _, r := range rows {
		n := byName[r.Name]
		if r.Since == nil || n == nil || (n.State == kmmv1beta1.StateLoaded && n.LoadedVersion != n.Labels[labelKey]) {
			continue
		}
		if t, ok := out[r.State]; !ok || r.Since.Time.Before(t) {
			out[r.State] = r.Since.Time
		}
	}
	return out
}

// priorUndo is the rollout-undo value the last status observed.
func priorUndo(m *kmmv1beta1.Module) string {
	if m.Status.Rollout == nil {
		return ""
	}
	return m.Status.Rollout.ObservedUndo
}

// byName orders status rows by node name.
func byName(a, b kmmv1beta1.RolloutNodeStatus) int { return strings.Compare(a.Name, b.Name) }

// newlyFailed are the failed nodes the last status of the same version did not list as failed.
func newlyFailed(prev *kmmv1beta1.RolloutStatus, version string, failed []kmmv1beta1.RolloutNodeStatus) []kmmv1beta1.RolloutNodeStatus {
	var out []kmmv1beta1.RolloutNodeStatus
	for _, f := range failed {
		if prev == nil || prev.Version != version || !slices.ContainsFunc(prev.Nodes, func(r kmmv1beta1.RolloutNodeStatus) bool {
			return r.Name == f.Name && r.State == kmmv1beta1.UpgradeFailed
		}) {
			out = append(out, f)
		}
	}
	return out
}

// automatic says whether the operator rolls the Module's version out itself.
func automatic(m *kmmv1beta1.Module) bool {
	return m.Spec.UpgradePolicy != nil && m.Spec.UpgradePolicy.Automatic &&
		m.Spec.Version() != "" && m.DeletionTimestamp.IsZero()
}

// budget resolves maxUnavailable against total nodes: rounded down, but at least 1 for a positive
// percentage; 1 when unset or unparsable; never negative.
func budget(mu *intstr.IntOrString, total int) int {
	if mu == nil {
		return 1
	}
	return resolve(mu, total, 1)
}

// failureBudget resolves maxFailed like maxUnavailable; 0 (no budget) when unset or unparsable.
func failureBudget(mf *intstr.IntOrString, total int) int {
	if mf == nil {
		return 0
	}
	return resolve(mf, total, 0)
}

// resolve scales a number or percentage against total: rounded down, but at least 1 for a positive
// percentage; invalid when unparsable; never negative.
func resolve(v *intstr.IntOrString, total, invalid int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(v, total, false)
	if err != nil {
		return invalid
	}
	if n <= 0 && v.Type == intstr.String && percentPositive(v.StrVal) {
		return 1
	}
	return max(n, 0)
}

// percentPositive says whether a percentage string such as "10%" is above zero.
func percentPositive(s string) bool {
	v, err := intstr.GetScaledValueFromIntOrPercent(&intstr.IntOrString{Type: intstr.String, StrVal: s}, 100, true)
	return err == nil && v > 0
}
