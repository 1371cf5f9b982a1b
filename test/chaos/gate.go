package chaos

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"
)

// The fault mixes: the sets of fault kinds that are on together in one phase window.
const (
	// MixAll is every kind of Options.Faults.
	MixAll = "all"
	// MixSteadyLeader is every kind but the manager kills and the partitions, which move the Lease:
	// under MixAll a new leader every two or three seconds makes few requests, so few of them meet
	// a request fault and few of its writes a 409. Options.SteadyLeaderShare gives this mix its
	// share of the fault time.
	MixSteadyLeader = "steady-leader"
)

// inMix says whether faults of kind are injected under mix.
func inMix(mix, kind string) bool {
	if mix != MixSteadyLeader {
		return true
	}
	return kind != FaultKill && kind != FaultPartition
}

// faultGate turns the injected faults on and off. Options.PhaseWindow bounds how long one phase of
// a round is faulted: past it the faults pause until the phase converged, so that every phase of
// every round completes and the next one is faulted in turn, instead of the faults falling on a
// load that cannot finish under them. Options.Duration counts only the time the faults are on.
// Each window is faulted with one mix (MixAll or MixSteadyLeader).
type faultGate struct {
	mu     sync.Mutex
	on     bool
	mix    string
	since  time.Time                // when the faults last turned on
	total  map[string]time.Duration // time on before since, by mix
	change chan struct{}            // closed on every change
}

func newFaultGate() *faultGate {
	return &faultGate{mix: MixAll, total: map[string]time.Duration{}, change: make(chan struct{})}
}

// set turns the faults on (with mix) or off; it says whether that changed anything.
func (g *faultGate) set(on bool, mix string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on == on && (!on || g.mix == mix) {
		return false
	}
	now := time.Now()
	if g.on {
		g.total[g.mix] += now.Sub(g.since)
	}
	g.on, g.since = on, now
	if on {
		g.mix = mix
	}
	close(g.change)
	g.change = make(chan struct{})
	return true
}

// nextMix is the mix of the next window, a window of phase: for an upgrade MixSteadyLeader while
// it has had less than share of the fault time so far, MixAll otherwise (the first window is
// MixAll). Only upgrades get MixSteadyLeader: they are the phase of kmm's updates (cordons, node
// labels, NMC status), so a leader left in place there meets 409s; a load or a deletion under it
// makes few (0 of 144 in one run), and the 409s of a run would depend on where its steady windows
// fell.
func (g *faultGate) nextMix(share float64, phase string) string {
	if phase != PhaseUpgrade {
		return MixAll
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var all time.Duration
	for _, d := range g.total {
		all += d
	}
	if share > 0 && all > 0 && float64(g.total[MixSteadyLeader]) < share*float64(all) {
		return MixSteadyLeader
	}
	return MixAll
}

// allows says whether faults of kind are on now.
func (g *faultGate) allows(kind string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.on && inMix(g.mix, kind)
}

// wait blocks until the faults are on with a mix that has kind; false when ctx ended first.
func (g *faultGate) wait(ctx context.Context, kind string) bool {
	for {
		g.mu.Lock()
		on, change := g.on && inMix(g.mix, kind), g.change
		g.mu.Unlock()
		if on {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-change:
		}
	}
}

// onTime is how long the faults have been on in all.
func (g *faultGate) onTime() time.Duration {
	var all time.Duration
	for _, d := range g.mixTimes() {
		all += d
	}
	return all
}

// mixTimes is how long the faults have been on, by mix.
func (g *faultGate) mixTimes() map[string]time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := maps.Clone(g.total)
	if g.on {
		out[g.mix] += time.Since(g.since)
	}
	return out
}

// setFaultsOn turns the faults on (with mix) or off: the injector's loops and the proxies' request
// faults (on in every mix).
func (h *harness) setFaultsOn(on bool, mix string) {
	if !h.gate.set(on, mix) {
		return
	}
	pf := ProxyFaults{}
	if on {
		pf = h.proxyFaults
	}
	for _, r := range h.replicas {
		r.proxy.setFaults(pf)
	}
	if on {
		h.sayf("faults on (mix %q) in the %s phase", mix, h.currentPhase())
	} else {
		h.sayf("faults paused: the %s phase was faulted for %v without converging", h.currentPhase(), h.o.PhaseWindow)
	}
}

// stopAfterFaultTime cancels stop once the faults have been on for Options.Duration and every kind
// of Options.Minimums has reached its count, or at Options.FaultWall (pauses included), whichever
// comes first: the counts a run reaches then no longer depend on how fast the machine served the
// requests (past CI runs stopped at 78, 83 and 95 409s of 100 at the end of Duration).
func (h *harness) stopAfterFaultTime(ctx context.Context, stop context.CancelFunc) {
	wall := time.Now().Add(h.o.FaultWall)
	for !h.faultTimeDone() && time.Now().Before(wall) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	if lacking := h.lackingFaults(); len(lacking) > 0 {
		h.sayf("fault phase ended at its wall bound %v with kinds below their minimum: %v", h.o.FaultWall, lacking)
	}
	stop()
}

// faultTimeDone says whether the faults have been on for Options.Duration and every minimum is met.
func (h *harness) faultTimeDone() bool {
	return h.gate.onTime() >= h.o.Duration && len(h.lackingFaults()) == 0
}

// lackingFaults are the kinds of Options.Minimums below their count, as kind: count/minimum.
func (h *harness) lackingFaults() []string {
	got := h.counts.snapshot()
	var out []string
	for _, kind := range sortedKeys(h.o.Minimums) {
		if got[kind] < h.o.Minimums[kind] {
			out = append(out, fmt.Sprintf("%s: %d/%d", kind, got[kind], h.o.Minimums[kind]))
		}
	}
	return out
}
