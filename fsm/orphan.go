package fsm

import "time"

// An NMC spec entry of a Module that does not exist has no one to rewrite or remove it: no Module
// reconcile would ever write it again (upstream KMM's entry of a Module deleted while upstream was
// stopped, its finalizer removed by hand; or kmm's own, if kmm's finalizer was). Such an orphaned
// entry keeps the module loaded on the node for good. It is removed after a grace period, so that
// a Module re-created soon after (a GitOps tool re-applying it, an administrator switching operators
// in steps) takes its entries over instead; the NMC controller then unloads the module as for any
// removed entry.

// DefaultOrphanGrace is how long an NMC spec entry of a Module that does not exist is kept before
// it is removed.
const DefaultOrphanGrace = 5 * time.Minute

// OrphanFacts is what the Module→NMC controller knows about the spec entries of a Module that does
// not exist.
type OrphanFacts struct {
	// Nodes are the nodes whose NMC has a spec entry of the Module.
	Nodes []string
	// Since is when this process first saw them without their Module (an operator restart starts
	// the grace again: it can delay a removal, never hasten it).
	Since time.Time
	// Now is the time of the decision.
	Now time.Time
	// Grace is how long the entries are kept; 0 means DefaultOrphanGrace.
	Grace time.Duration
}

// OrphanDecision is what to do with them.
type OrphanDecision struct {
	// Remove asks to remove the entries on Nodes now.
	Remove bool
	// RequeueAfter asks to decide again after this long (the grace is not over).
	RequeueAfter time.Duration
}

// DecideOrphans removes a Module's orphaned entries once they have been seen orphaned for the grace.
func DecideOrphans(in OrphanFacts) OrphanDecision {
	if len(in.Nodes) == 0 {
		return OrphanDecision{}
	}
	grace := in.Grace
	if grace <= 0 {
		grace = DefaultOrphanGrace
	}
	since := in.Since
	if since.IsZero() {
		since = in.Now
	}
	if left := since.Add(grace).Sub(in.Now); left > 0 {
		return OrphanDecision{RequeueAfter: left}
	}
	return OrphanDecision{Remove: true}
}
