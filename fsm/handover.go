package fsm

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// After a takeover from upstream Kernel Module Management, upstream's device plugin DaemonSets (owned
// by the Module, docs/migration.md) still run beside kmm's. They are handed over so that no node
// with the module loaded is ever without a device plugin pod: kmm's DaemonSet runs first (both
// select the same nodes, by the module's ready label), and upstream's is deleted only once kmm's
// pod is Ready on every node upstream's serves. The wait is bounded: past the handover timeout the
// handover is stuck, which the Module reports (upstream's DaemonSets still stay: deleting them would
// leave the nodes kmm's does not serve without a device plugin).

// DefaultHandoverTimeout bounds how long upstream's device plugin waits for kmm's to be Ready on
// its nodes before the handover is reported stuck.
const DefaultHandoverTimeout = 10 * time.Minute

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
	// KMMPods are the nodes where a pod of kmm's device plugin exists, Ready or not.
	KMMPods map[string]bool
	// Since is when the handover began: the newest creation time of the Module's device plugin
	// DaemonSets, kmm's and upstream's (kmm's pods have had since then to become Ready). It is
	// read from the cluster, so an operator restart does not restart the wait.
	Since time.Time
	// Now is the time of the decision.
	Now time.Time
	// Timeout bounds the wait; 0 means DefaultHandoverTimeout.
	Timeout time.Duration
}

// Handover is the decision about upstream's device plugin DaemonSets of a Module.
type Handover struct {
	// DeleteUpstream asks to delete them (their pods go with them).
	DeleteUpstream bool
	// Waiting are the nodes (sorted) that only upstream's device plugin serves yet.
	Waiting []string
	// Stuck says kmm's device plugin has not served Waiting for longer than the timeout: the
	// Module is Degraded (DevicePluginHandoverStuck) with Message; upstream's DaemonSets stay.
	Stuck bool
	// Message says which nodes wait and why ("" when none).
	Message string
}

// DecideHandover deletes upstream's device plugin once kmm's is Ready on every node upstream's
// serves; at once when kmm runs none (the Module is deleted, or has no device plugin any more):
// then no device plugin is wanted, and upstream's pods must go before the module is unloaded.
// Waiting longer than the timeout makes the handover stuck; it still waits.
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
	if len(waiting) == 0 {
		return Handover{DeleteUpstream: true}
	}
	slices.Sort(waiting)
	timeout := in.Timeout
	if timeout <= 0 {
		timeout = DefaultHandoverTimeout
	}
	d := Handover{Waiting: waiting, Stuck: !in.Since.IsZero() && in.Now.Sub(in.Since) >= timeout}
	d.Message = handoverMessage(waiting, in.KMMPods, d.Stuck, timeout)
	return d
}

// handoverMessage names the nodes that wait for kmm's device plugin (the first few) and why.
func handoverMessage(waiting []string, pods map[string]bool, stuck bool, timeout time.Duration) string {
	const shown = 5
	var items []string
	for _, n := range waiting[:min(len(waiting), shown)] {
		why := "no pod"
		if pods[n] {
			why = "pod not Ready"
		}
		items = append(items, n+" ("+why+")")
	}
	list := strings.Join(items, ", ")
	if len(waiting) > shown {
		list += fmt.Sprintf(" and %d more", len(waiting)-shown)
	}
	if stuck {
		return fmt.Sprintf("kmm's device plugin is not Ready after %v on %s: upstream KMM's device plugin DaemonSet is kept until it is", timeout, list)
	}
	return "upstream KMM's device plugin stays until kmm's is Ready on " + list
}
