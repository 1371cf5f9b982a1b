package fsm

import "slices"

// After a switch from upstream Kernel Module Management, upstream's device plugin DaemonSets (owned
// by the Module, docs/migration.md) still run beside kmm's. They are handed over so that no node
// with the module loaded is ever without a device plugin pod: kmm's DaemonSet runs first (both
// select the same nodes, by the module's ready label), and upstream's is deleted only once kmm's
// pod is Ready on every node upstream's serves.

// HandoverFacts is what the Module→NMC controller knows about a Module's device plugins while
// upstream KMM's DaemonSets of it exist.
type HandoverFacts struct {
	// KMMRuns says kmm runs a device plugin for the Module: it has one and is not being deleted.
	KMMRuns bool
	// UpstreamNodes are the nodes where a pod of upstream's device plugin is scheduled and not
	// being deleted.
	UpstreamNodes []string
	// KMMReady are the nodes where a pod of kmm's device plugin is Ready.
	KMMReady map[string]bool
}

// Handover is the decision about upstream's device plugin DaemonSets of a Module.
type Handover struct {
	// DeleteUpstream asks to delete them (their pods go with them).
	DeleteUpstream bool
	// Waiting are the nodes (sorted) that only upstream's device plugin serves yet.
	Waiting []string
}

// DecideHandover deletes upstream's device plugin once kmm's is Ready on every node upstream's
// serves; at once when kmm runs none (the Module is deleted, or has no device plugin any more):
// then no device plugin is wanted, and upstream's pods must go before the module is unloaded.
func DecideHandover(in HandoverFacts) Handover {
	if !in.KMMRuns {
		return Handover{DeleteUpstream: true}
	}
	var waiting []string
	for _, n := range in.UpstreamNodes {
		if !in.KMMReady[n] && !slices.Contains(waiting, n) {
			waiting = append(waiting, n)
		}
	}
	slices.Sort(waiting)
	return Handover{DeleteUpstream: len(waiting) == 0, Waiting: waiting}
}
