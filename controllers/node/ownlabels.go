package node

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/internal/expectations"
)

// maxOlderVersions bounds the versions a patchedNode remembers: the patches the controller makes
// to one node before its cache shows the first of them.
const maxOlderVersions = 8

// patchedNode is a Node as the NMC controller's own last label patch left it (the API server's
// answer to the patch), with the versions of the node that patch and the ones before it were
// decided on: the versions the patched node is known to be newer than.
type patchedNode struct {
	older []string
	node  *corev1.Node
}

// ownLabelPatches returns the reconciler's remembered label patches by node name, created on first
// use with the pod expectations.
func (r *NMCReconciler) ownLabelPatches() *expectations.Store[string, patchedNode] {
	r.expected()
	return r.labelPatches
}

// rememberLabelPatch keeps the answer to the controller's label patch of a node until the cache
// shows a version other than the one the patch was decided on, from, and the ones before it still
// remembered (or for expectationTTL).
func (r *NMCReconciler) rememberLabelPatch(from string, patched *corev1.Node, now time.Time) {
	patches := r.ownLabelPatches()
	older := []string{from}
	if prev, ok := patches.Get(patched.Name, now); ok {
		older = append(prev.older[max(0, len(prev.older)+1-maxOlderVersions):], from)
	}
	patches.Expect(patched.Name, patchedNode{older: older, node: patched}, now)
}

// overlayLabelPatch puts the node as the controller's own last label patch left it in place of a
// cached node still at the version that patch was decided on. A reconcile that runs between the
// patch and its watch event (the NMC status write made just before the patch brings one at once)
// would otherwise decide on the labels before the patch: write the unchanged status again, the
// fence that comes before a label change, and send the same patch again (issue 41: TestSmoke met
// it at 10 nodes, TestOwnLabelPatchNotRepeatedOnALaggingNodeCache makes it happen every time).
// The answer of the patch is the API server's own later version of the node, so the decision is on
// fresher facts, never on a guess. Any version in the cache other than those the patches were
// decided on ends the overlay: the cache has caught up with the patch or gone past it.
func (r *NMCReconciler) overlayLabelPatch(f *nodeFacts, now time.Time) {
	patches := r.ownLabelPatches()
	patches.Prune(now)
	patches.Observed(f.node.Name, func(p patchedNode) bool { return !slices.Contains(p.older, f.node.ResourceVersion) })
	if p, ok := patches.Get(f.node.Name, now); ok {
		f.node = p.node // read only, as the cache's object is: a write copies it (writableNode)
	}
}
