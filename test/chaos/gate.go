package chaos

import (
	"context"
	"sync"
	"time"
)

// faultGate turns the injected faults on and off. Options.PhaseWindow bounds how long one phase of
// a round is faulted: past it the faults pause until the phase converged, so that every phase of
// every round completes and the next one is faulted in turn, instead of the faults falling on a
// load that cannot finish under them. Options.Duration counts only the time the faults are on.
type faultGate struct {
	mu     sync.Mutex
	on     bool
	since  time.Time     // when the faults last turned on
	total  time.Duration // time on before since
	change chan struct{} // closed on every change
}

func newFaultGate() *faultGate { return &faultGate{change: make(chan struct{})} }

// set turns the faults on or off; it says whether that changed anything.
func (g *faultGate) set(on bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on == on {
		return false
	}
	now := time.Now()
	if g.on {
		g.total += now.Sub(g.since)
	}
	g.on, g.since = on, now
	close(g.change)
	g.change = make(chan struct{})
	return true
}

// wait blocks until the faults are on; false when ctx ended first.
func (g *faultGate) wait(ctx context.Context) bool {
	for {
		g.mu.Lock()
		on, change := g.on, g.change
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
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on {
		return g.total + time.Since(g.since)
	}
	return g.total
}

// setFaultsOn turns the faults on or off: the injector's loops and the proxies' request faults.
func (h *harness) setFaultsOn(on bool) {
	if !h.gate.set(on) {
		return
	}
	pf := ProxyFaults{}
	if on {
		pf = h.proxyFaults
	}
	for _, r := range h.replicas {
		r.proxy.setFaults(pf)
	}
	if !on {
		h.sayf("faults paused: the %s phase was faulted for %v without converging", h.currentPhase(), h.o.PhaseWindow)
	}
}

// stopAfterFaultTime cancels stop once the faults have been on for Options.Duration, or the wall
// time reached four times that (pauses included).
func (h *harness) stopAfterFaultTime(ctx context.Context, stop context.CancelFunc) {
	wall := time.Now().Add(4 * h.o.Duration)
	for h.gate.onTime() < h.o.Duration && time.Now().Before(wall) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
}
