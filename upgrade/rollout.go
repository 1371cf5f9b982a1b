package upgrade

import (
	"slices"
	"strings"

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
}

// startedTowards says whether the node's pair is on its way to the version label: it drains or
// unloads another version for it (or has unloaded it), or kmm cordoned the node for it. A reload of
// the label's own version after a reboot, or a first load, is not.
func (n *RolloutNode) startedTowards(label string) bool {
	return n.State == kmmv1beta1.StateUpgrading || n.CordonedByKMM || (n.LoadedVersion != "" && n.LoadedVersion != label)
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
	// Done, InProgress and Pending partition the managed nodes.
	Done, InProgress, Pending int
	// Unavailable counts in-progress nodes plus cordoned or NotReady nodes, done or not.
	Unavailable int
	// Budget is maxUnavailable resolved against Total.
	Budget int
}

// Complete says whether every managed node runs the Module's version.
func (p Progress) Complete() bool {
	return p.Done == p.Total
}

// PlanRollout returns the version-module labels to set, and the classification of the selected
// nodes behind them, so that the rollout advances without more than maxUnavailable nodes
// unavailable at once:
//
//   - nothing unless upgradePolicy.automatic is true and the Module has a version (and is not
//     being deleted);
//   - nodes with the upgrade-skip label are never touched and do not count anywhere;
//   - a node is done when its label equals the version and its pair is Loaded with that version,
//     in progress when its label equals the version but it is not done, or when it started
//     towards the version its label names and the Module has since left (startedTowards), and
//     pending otherwise
//     (a missing label is adopted: it is set like any other);
//   - unavailable = in-progress nodes + cordoned or NotReady nodes (done ones too: a cordon kmm
//     has not lifted yet, or a node that went NotReady after its upgrade, is unavailable all the same);
//   - a node in progress to a version the Module no longer has (a bump during the rollout) is
//     retargeted at once: it is unavailable already, and kmm's own cordon would otherwise keep it
//     from ever starting again;
//   - at most budget − unavailable pending nodes start, by name; a cordoned or NotReady pending
//     node never starts.
func PlanRollout(in RolloutInput) ([]Intent, Progress) {
	m := in.Module
	if m == nil || !automatic(m) {
		return nil, Progress{}
	}
	version := m.Spec.Version()
	p, c := classify(m, in.Nodes)
	p.Budget = budget(m.Spec.UpgradePolicy, p.Total)

	starts := c.pending
	slices.SortFunc(starts, strings.Compare)
	starts = starts[:min(max(p.Budget-p.Unavailable, 0), len(starts))]
	names := append(slices.Sorted(slices.Values(c.retarget)), starts...)
	if len(names) == 0 {
		return nil, p
	}
	intents := make([]Intent, 0, len(names))
	for _, name := range names {
		intents = append(intents, Intent{Node: name, Version: version})
	}
	return intents, p
}

// candidates are the nodes a rollout may label: pending nodes that may start (Ready and
// schedulable), and nodes in progress to a version the Module no longer has.
type candidates struct {
	pending, retarget []string
}

// classify counts the managed nodes as done, in progress or pending and returns the nodes that may
// be labelled.
func classify(m *kmmv1beta1.Module, nodes []RolloutNode) (Progress, candidates) {
	version := m.Spec.Version()
	labelKey := kmmv1beta1.ModuleVersionLabel(m.Namespace, m.Name)
	skipKey := kmmv1beta1.UpgradeSkipLabel(m.Namespace, m.Name)
	var p Progress
	var c candidates
	for i := range nodes {
		n := &nodes[i]
		if _, skip := n.Labels[skipKey]; skip {
			continue
		}
		p.Total++
		label, hasLabel := n.Labels[labelKey]
		runsLabel := n.State == kmmv1beta1.StateLoaded && n.LoadedVersion == label
		unavailable := !n.Ready || n.Unschedulable
		switch {
		case hasLabel && label == version && runsLabel:
			p.Done++
		case hasLabel && label == version:
			p.InProgress++
			unavailable = true
		case hasLabel && n.startedTowards(label):
			p.InProgress++
			unavailable = true
			c.retarget = append(c.retarget, n.Name)
		default:
			p.Pending++
			if !unavailable {
				c.pending = append(c.pending, n.Name)
			}
		}
		if unavailable {
			p.Unavailable++
		}
	}
	return p, c
}

// automatic says whether the operator rolls the Module's version out itself.
func automatic(m *kmmv1beta1.Module) bool {
	return m.Spec.UpgradePolicy != nil && m.Spec.UpgradePolicy.Automatic &&
		m.Spec.Version() != "" && m.DeletionTimestamp.IsZero()
}

// budget resolves maxUnavailable against total nodes: rounded down, but at least 1 for a positive
// percentage; 1 when unset or unparsable; never negative.
func budget(policy *kmmv1beta1.UpgradePolicy, total int) int {
	if policy == nil || policy.MaxUnavailable == nil {
		return 1
	}
	mu := policy.MaxUnavailable
	n, err := intstr.GetScaledValueFromIntOrPercent(mu, total, false)
	if err != nil {
		return 1
	}
	if n <= 0 && mu.Type == intstr.String && percentPositive(mu.StrVal) {
		return 1
	}
	return max(n, 0)
}

// percentPositive says whether a percentage string such as "10%" is above zero.
func percentPositive(s string) bool {
	v, err := intstr.GetScaledValueFromIntOrPercent(&intstr.IntOrString{Type: intstr.String, StrVal: s}, 100, true)
	return err == nil && v > 0
}
