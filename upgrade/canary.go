package upgrade

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// canaryChoice is the canary of a step: upgradePolicy.canary, its nodes, and the last status's
// canary of this version (nil: none).
type canaryChoice struct {
	spec  *kmmv1beta1.CanarySpec
	nodes []string
	prev  *kmmv1beta1.CanaryStatus
}

// chooseCanary keeps the canary nodes the last status of this version chose; else it chooses them
// (when some node is there to choose): the managed nodes nodeSelector matches (every managed node
// without one), by name, the first count of them (0: 1 without nodeSelector, all with it), at most
// MaxCanaryNodes.
func chooseCanary(m *kmmv1beta1.Module, nodes []RolloutNode) canaryChoice {
	spec := m.Spec.UpgradePolicy.Canary
	if spec == nil {
		return canaryChoice{}
	}
	cn := canaryChoice{spec: spec}
	if st := m.Status.Rollout; st != nil && st.Version == m.Spec.Version() && st.Canary != nil && len(st.Canary.Nodes) > 0 {
		cn.prev = st.Canary
		cn.nodes = slices.Clone(st.Canary.Nodes)
		return cn
	}
	skipKey := kmmv1beta1.UpgradeSkipLabel(m.Namespace, m.Name)
	sel := labels.SelectorFromSet(spec.NodeSelector)
	for i := range nodes {
		if _, skip := nodes[i].Labels[skipKey]; !skip && sel.Matches(labels.Set(nodes[i].Labels)) {
			cn.nodes = append(cn.nodes, nodes[i].Name)
		}
	}
	slices.Sort(cn.nodes)
	count := int(spec.Count)
	if count == 0 && len(spec.NodeSelector) == 0 {
		count = 1
	}
	if count == 0 {
		count = kmmv1beta1.MaxCanaryNodes
	}
	cn.nodes = cn.nodes[:min(len(cn.nodes), count, kmmv1beta1.MaxCanaryNodes)]
	return cn
}

// is says whether a node is a canary.
func (cn canaryChoice) is(name string) bool {
	return cn.spec != nil && slices.Contains(cn.nodes, name)
}

// active says whether the canary holds the other nodes back (it has not passed before).
func (cn canaryChoice) active() bool {
	return cn.spec != nil && (cn.prev == nil || !cn.prev.Passed)
}

// soakStart is when the canaries have been Upgraded together since (nil while one is not, or
// while there is no canary node yet).
func (cn canaryChoice) soakStart(allDone bool, now time.Time) *metav1.Time {
	switch {
	case !allDone || len(cn.nodes) == 0:
		return nil
	case cn.prev != nil && cn.prev.SoakStart != nil:
		return cn.prev.SoakStart.DeepCopy()
	}
	t := metav1.NewTime(now).Rfc3339Copy()
	return &t
}

// passed says whether the other nodes may start: no canary, passed before, or every canary node
// Upgraded for soakSeconds without a break.
func (cn canaryChoice) passed(allDone bool, now time.Time) bool {
	if !cn.active() {
		return true
	}
	start := cn.soakStart(allDone, now)
	return start != nil && !now.Before(start.Add(time.Duration(cn.spec.SoakSeconds)*time.Second))
}

// status is status.rollout.canary (nil without upgradePolicy.canary).
func (cn canaryChoice) status(allDone bool, now time.Time) *kmmv1beta1.CanaryStatus {
	if cn.spec == nil {
		return nil
	}
	st := &kmmv1beta1.CanaryStatus{Nodes: cn.nodes, Passed: cn.passed(allDone, now)}
	if st.Passed && cn.prev != nil && cn.prev.Passed {
		st.SoakStart = cn.prev.SoakStart.DeepCopy()
	} else {
		st.SoakStart = cn.soakStart(allDone, now)
	}
	return st
}
