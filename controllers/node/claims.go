package node

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/fsm"
)

// +kubebuilder:rbac:groups=resource.k8s.io,resources=resourceclaims,verbs=list

// The bound of the ResourceClaims read for one node: claimPages pages of claimPageSize. A cluster
// with more counts as holding the node (the unload waits, with a message saying why) rather than
// missing a claim.
const (
	claimPageSize = 500
	claimPages    = 20
)

// claimFacts are the ResourceClaims that hold back the unload of a pair whose Module has a DRA
// driver (fsm.ClaimHoldsNode), read (uncached, once per reconcile) only while the pair may unload
// (fsm.Facts.MayUnload).
func (r *NMCReconciler) claimFacts(ctx context.Context, f *nodeFacts, key string, facts *fsm.Facts) ([]string, error) {
	driver := f.drivers[key]
	if driver == "" || r.APIReader == nil || !facts.MayUnload() {
		return nil, nil
	}
	if f.claims == nil {
		claims, complete, err := r.readClaims(ctx)
		if err != nil {
			return nil, err
		}
		f.claims = claims
		if !complete {
			return []string{fmt.Sprintf("(more than %d ResourceClaims in the cluster: not all read)", claimPages*claimPageSize)}, nil
		}
	}
	var out []string
	for i := range f.claims {
		if c := &f.claims[i]; fsm.ClaimHoldsNode(c, driver, f.node.Name, f.node.Labels) {
			out = append(out, c.Namespace+"/"+c.Name)
		}
	}
	sort.Strings(out)
	if len(out) > fsm.MaxClaimsListed {
		out = out[:fsm.MaxClaimsListed]
	}
	return out, nil
}

// readClaims lists every ResourceClaim, page by page, up to the bound; complete is false when more remain.
func (r *NMCReconciler) readClaims(ctx context.Context) (claims []resourcev1.ResourceClaim, complete bool, err error) {
	out := []resourcev1.ResourceClaim{}
	cont := ""
	for range claimPages {
		list := &resourcev1.ResourceClaimList{}
		if err := r.APIReader.List(ctx, list, client.Limit(claimPageSize), client.Continue(cont)); err != nil {
			return nil, false, err
		}
		out = append(out, list.Items...)
		if cont = list.Continue; cont == "" {
			return out, true, nil
		}
	}
	return out, false, nil
}

// ownDRADrivers are the Module's own DRA driver pods on the node, as an upgrade drain sees them:
// never spared, evicted last (fsm.WorkloadPod.OwnDRADriver).
func ownDRADrivers(f *nodeFacts, key string) []fsm.WorkloadPod {
	var out []fsm.WorkloadPod
	for _, p := range f.draPods[key] {
		w := observeWorkload(p, nil)
		w.OwnDRADriver = true
		out = append(out, w)
	}
	return out
}

// isOwnDRADriver says whether p is one of the Module's DRA driver pods listed by ownDRADrivers.
func isOwnDRADriver(f *nodeFacts, key string, p *corev1.Pod) bool {
	for _, d := range f.draPods[key] {
		if d.UID == p.UID {
			return true
		}
	}
	return false
}
