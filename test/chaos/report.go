package chaos

import (
	"fmt"
	"io"
	"strings"
)

// Report is what a run measured.
type Report struct {
	Seed    uint64   `json:"seed"`
	Nodes   int      `json:"nodes"`
	Modules int      `json:"modules"`
	Pairs   int      `json:"pairs"`
	Bugs    []string `json:"bugs,omitempty"`
	// APIServers are the kube-apiserver instances behind the balancer.
	APIServers int `json:"apiServers"`
	// Rounds are the full rounds (load, upgrade, deletion) done under faults; PhasesUnderFaults
	// the phases that completed under faults, by phase.
	Rounds            int            `json:"rounds"`
	PhasesUnderFaults map[string]int `json:"phasesUnderFaults"`
	// PhasesAfterPause are the phases of PhasesUnderFaults that converged only once the faults
	// paused (Options.PhaseWindow); FaultSeconds how long the faults were on.
	PhasesAfterPause map[string]int `json:"phasesAfterPause"`
	FaultSeconds     float64        `json:"faultSeconds"`
	// MixSeconds is FaultSeconds by fault mix (MixAll, MixSteadyLeader).
	MixSeconds map[string]float64 `json:"mixSeconds"`
	// Faults are the faults injected, by kind (FaultKinds).
	Faults map[string]int `json:"faults"`
	// FaultsByPhase are the faults by the phase of the round they fell in, then by kind.
	FaultsByPhase map[string]map[string]int `json:"faultsByPhase"`
	// RequestFaults are the request faults (429, 500, 409, delay) by kind, then by the class of the
	// request they fell on: a watch as it opened, another read, or a write.
	RequestFaults map[string]map[string]int `json:"requestFaults"`
	// Checks are the invariant checks made, by invariant; Events the watch events seen.
	Checks map[string]int `json:"checks"`
	Events int            `json:"events"`
	// Violations must be empty.
	Violations []string `json:"violations"`
	// ConvergeSeconds is the time from the last fault to every pair converged (the interrupted
	// round finished, every Module deleted); ConvergedPhase the phase the faults stopped in.
	ConvergeSeconds float64 `json:"convergeSeconds"`
	ConvergedPhase  string  `json:"convergedPhase"`
	// BaselineWrites and FaultWrites are the replicas' successful writes per pair per round,
	// without faults and under them; BaselineSeconds the fault-free round's duration.
	BaselineWrites  float64 `json:"baselineWrites"`
	BaselineSeconds float64 `json:"baselineSeconds"`
	FaultWrites     float64 `json:"faultWrites"`
	// Downtime is, per restarted process, the median and longest time from kill to ready (s).
	Downtime map[string][2]float64 `json:"downtime"`
	// ReplicaStarts counts the starts of each replica (kills and lost Leases restart them).
	ReplicaStarts map[string]int `json:"replicaStarts"`
}

// Print writes the report for people.
func (r *Report) Print(w io.Writer) {
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(w, format+"\n", args...) }
	p("chaos report: seed %d, %d nodes x %d Modules (%d pairs), %d rounds under faults%s", r.Seed, r.Nodes, r.Modules, r.Pairs, r.Rounds,
		map[bool]string{true: ", seeded bugs " + strings.Join(r.Bugs, ","), false: ""}[len(r.Bugs) > 0])
	p("%d kube-apiserver instances behind a balancer; faults on for %.0f s (mix %q %.0f s, %q %.0f s)", r.APIServers, r.FaultSeconds,
		MixAll, r.MixSeconds[MixAll], MixSteadyLeader, r.MixSeconds[MixSteadyLeader])
	p("phases faulted and completed: load %d, upgrade %d, delete %d (of which converged only after the faults paused: %d, %d, %d)",
		r.PhasesUnderFaults[PhaseLoad], r.PhasesUnderFaults[PhaseUpgrade], r.PhasesUnderFaults[PhaseDelete],
		r.PhasesAfterPause[PhaseLoad], r.PhasesAfterPause[PhaseUpgrade], r.PhasesAfterPause[PhaseDelete])
	phases := sortedKeys(r.FaultsByPhase)
	head := fmt.Sprintf("  %-18s %6s", "faults injected", "total")
	for _, ph := range phases {
		head += fmt.Sprintf(" %9.9s", ph)
	}
	p("%s", head)
	for _, k := range FaultKinds {
		line := fmt.Sprintf("  %-18s %6d", k, r.Faults[k])
		for _, ph := range phases {
			line += fmt.Sprintf(" %9d", r.FaultsByPhase[ph][k])
		}
		p("%s", line)
	}
	for _, k := range []string{FaultThrottle, FaultServerError, FaultConflict, FaultDelay} {
		c := r.RequestFaults[k]
		if len(c) == 0 {
			continue
		}
		p("  %-18s on watch opens %d, other reads %d, writes %d", k, c[classWatch], c[classRead], c[classWrite])
	}
	for _, name := range sortedKeys(r.Downtime) {
		d := r.Downtime[name]
		p("  %s down (kill to ready): median %.2f s, max %.2f s", name, d[0], d[1])
	}
	p("replica starts: %v", r.ReplicaStarts)
	total := 0
	p("invariant checks (%d watch events):", r.Events)
	for _, k := range sortedKeys(r.Checks) {
		p("  %-52s %8d", k, r.Checks[k])
		total += r.Checks[k]
	}
	p("  %-52s %8d", "total", total)
	p("violations: %d", len(r.Violations))
	for i, v := range r.Violations {
		if i == 20 {
			p("  ... %d more", len(r.Violations)-20)
			break
		}
		p("  %s", v)
	}
	already := ""
	if r.ConvergeSeconds < 0.05 {
		// The last fault to end is often a restart that finished after the faults stopped, when
		// the cluster had converged already.
		already = "; it had converged when the last fault ended"
	}
	p("time to converge after the last fault: %.1f s (faults stopped during %q%s)", r.ConvergeSeconds, r.ConvergedPhase, already)
	p("writes per pair per round: %.1f fault-free (round of %.1f s), %.1f under faults", r.BaselineWrites, r.BaselineSeconds, r.FaultWrites)
}
