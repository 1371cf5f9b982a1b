package fsm

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
)

// ClaimsPoll is how often a pair that ResourceClaims hold back looks at them again (they are not
// watched: the operator reads them only for such pairs).
const ClaimsPoll = 5 * time.Second

// ClaimHoldsNode says whether a ResourceClaim holds back the unload of a Module whose DRA driver is
// driver on the node (name, labels): it is allocated, with a device of that driver, and its
// allocation is for the node (its node selector selects it). An allocation without a node selector
// is not node-local and holds no node. A requirement this function cannot judge (Gt, Lt, an
// unknown operator or field) counts as selecting: a claim is never missed.
func ClaimHoldsNode(c *resourcev1.ResourceClaim, driver, node string, nodeLabels map[string]string) bool {
	a := c.Status.Allocation
	if a == nil || a.NodeSelector == nil {
		return false
	}
	if !slices.ContainsFunc(a.Devices.Results, func(r resourcev1.DeviceRequestAllocationResult) bool { return r.Driver == driver }) {
		return false
	}
	return slices.ContainsFunc(a.NodeSelector.NodeSelectorTerms, func(t corev1.NodeSelectorTerm) bool {
		return termSelects(t, node, nodeLabels)
	})
}

// termSelects says whether a node selector term selects the node: every requirement holds.
func termSelects(t corev1.NodeSelectorTerm, node string, nodeLabels map[string]string) bool {
	for _, r := range t.MatchExpressions {
		v, ok := nodeLabels[r.Key]
		if !requirementHolds(r, v, ok) {
			return false
		}
	}
	for _, r := range t.MatchFields {
		if r.Key == "metadata.name" && !requirementHolds(r, node, true) {
			return false
		}
	}
	return len(t.MatchExpressions)+len(t.MatchFields) > 0
}

func requirementHolds(r corev1.NodeSelectorRequirement, v string, present bool) bool {
	switch r.Operator {
	case corev1.NodeSelectorOpIn:
		return present && slices.Contains(r.Values, v)
	case corev1.NodeSelectorOpNotIn:
		return !present || !slices.Contains(r.Values, v)
	case corev1.NodeSelectorOpExists:
		return present
	case corev1.NodeSelectorOpDoesNotExist:
		return !present
	}
	return true
}

// MayUnload says whether the pair may unload in this step or soon, or take its DRA driver away, the
// only times ResourceClaims are a fact of its decision (the reconciler reads them then,
// Facts.Claims): it may drain (Facts.MayDrain, but a first load that just succeeded:
// firstLoadInKernel), or it has a config recorded and is not simply
// Loaded (unloading, loading again, backing off), or it is Loaded and a Ready transition is about
// to have it load again.
func (f *Facts) MayUnload() bool {
	return f.mayDrainRecorded() || (f.Status.Config != nil && (f.state() != Loaded || f.readyNewerThanWorker()))
}

// claimsKeepDriver says whether allocated ResourceClaims of the Module's DRA driver keep the ready
// label, which the driver's DaemonSet selects: the module is in the kernel as far as the record
// says (a config recorded for the node's kernel, no boot since) and no unload is under way. The
// kubelet needs the driver to unprepare the claims (upstream KMM's issue 1332).
func (f *Facts) claimsKeepDriver() bool {
	return len(f.Claims) > 0 && f.statusKernelMatches() && !f.rebootedByBootID() && f.state() != Unloading
}
