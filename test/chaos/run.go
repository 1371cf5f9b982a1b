package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// run waits for a leader, runs the fault-free round (Baseline), then rounds under faults for
// Duration, then the convergence after the last fault.
func (h *harness) run(ctx context.Context) (*Report, error) {
	rep := &Report{Seed: h.o.Seed, Nodes: h.o.Nodes, Modules: h.o.Modules, Pairs: h.o.Nodes * h.o.Modules, Bugs: h.o.Bugs}
	if err := h.waitLeader(ctx); err != nil {
		return rep, err
	}
	if h.o.Baseline {
		h.sayf("fault-free round")
		baseCtx, cancel := context.WithTimeout(ctx, h.o.ConvergeTimeout) // about 6 s without faults
		w, secs, err := h.round(baseCtx, nil)
		cancel()
		if err != nil {
			return rep, fmt.Errorf("the fault-free round: %w", err)
		}
		rep.BaselineWrites, rep.BaselineSeconds = h.perPair(w, 1), secs
	}
	h.sayf("rounds under faults for %v (seed %d)", h.o.Duration, h.o.Seed)
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	go h.stopAfterFaultTime(faultCtx, stopFaults)
	var wg sync.WaitGroup
	h.inject(faultCtx, &wg)
	go h.stopEarly(faultCtx, stopFaults)
	writes := map[string]int{}
	rounds := 0
	var phaseErr error
	for faultCtx.Err() == nil {
		w, _, err := h.round(faultCtx, &rounds)
		for k, v := range w {
			writes[k] += v
		}
		if err != nil {
			if faultCtx.Err() == nil {
				phaseErr = err
			}
			break
		}
	}
	stopFaults()
	wg.Wait()
	h.restarts.Wait()
	h.quiet()
	last := h.lastFault()
	h.sayf("faults stopped after %d full rounds; converging", rounds)
	convCtx, cancel := context.WithTimeout(ctx, h.o.ConvergeTimeout)
	defer cancel()
	phase, err := h.finishRound(convCtx)
	if err != nil {
		h.watch.final(invConverged, []string{fmt.Sprintf("not converged %v after the last fault: %v", h.o.ConvergeTimeout, err)})
	} else {
		h.watch.final(invConverged, nil)
		rep.ConvergeSeconds = time.Since(last).Seconds()
		rep.ConvergedPhase = phase
	}
	h.watch.final(invCordons, h.cordonsLeft(ctx))
	for k, v := range h.takeWrites() {
		writes[k] += v
	}
	rep.Rounds = rounds
	rep.FaultWrites = h.perPair(writes, max(rounds, 1))
	rep.Faults = h.counts.snapshot()
	rep.FaultsByPhase = h.counts.phases()
	rep.RequestFaults = h.counts.classes()
	rep.PhasesUnderFaults = h.phasesDone
	rep.PhasesAfterPause = h.phasesPaused
	rep.FaultSeconds = h.gate.onTime().Seconds()
	rep.MixSeconds = map[string]float64{}
	for mix, d := range h.gate.mixTimes() {
		rep.MixSeconds[mix] = d.Seconds()
	}
	rep.APIServers = h.o.APIServers
	rep.Checks, rep.Violations, rep.Events = h.watch.result()
	rep.Downtime = h.downtimes()
	rep.ReplicaStarts = map[string]int{}
	for _, r := range h.replicas {
		rep.ReplicaStarts[r.name] = r.startCount()
	}
	return rep, phaseErr
}

// stopEarly ends the fault phase before Duration: once the aims settled (Options.AimSettle), or at
// the first violation (Options.StopOnViolation).
func (h *harness) stopEarly(ctx context.Context, stop context.CancelFunc) {
	settle := h.aims != nil && h.o.AimSettle > 0
	if !settle && !h.o.StopOnViolation {
		return
	}
	for ; ctx.Err() == nil; time.Sleep(100 * time.Millisecond) {
		if settle && h.aims.settledFor(h.o.AimSettle) {
			h.sayf("every aim fired, nothing aimed for %v: faults stopped", h.o.AimSettle)
			stop()
			return
		}
		if h.o.StopOnViolation && h.violated() {
			stop()
			return
		}
	}
}

// waitLeader waits until a replica holds the Lease.
func (h *harness) waitLeader(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for h.leases.current() == "" {
		if time.Now().After(deadline) {
			return errors.New("no replica took the Lease within 60 s: see the manager logs")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// round runs load, upgrade and deletion; rounds counts the rounds that finished. It returns the
// replicas' writes during the round and how long it took.
func (h *harness) round(ctx context.Context, rounds *int) (map[string]int, float64, error) {
	t0 := time.Now()
	h.takeWrites()
	for _, p := range Phases {
		h.setPhase(p)
		paused := h.faultWindow(rounds != nil)
		err := h.phase(ctx, p)
		if rounds != nil && paused() && err == nil {
			h.phasesPaused[p]++
		}
		if err != nil {
			return h.takeWrites(), 0, err
		}
		if rounds != nil {
			h.phasesDone[p]++
		}
	}
	h.setPhase("")
	if rounds != nil {
		*rounds++
	}
	return h.takeWrites(), time.Since(t0).Seconds(), nil
}

// faultWindow turns the faults on for a phase under faults and off once it has run for
// Options.PhaseWindow; the function returned stops the window and says whether it paused them.
func (h *harness) faultWindow(underFaults bool) func() bool {
	if !underFaults || h.o.PhaseWindow <= 0 {
		return func() bool { return false }
	}
	h.setFaultsOn(true, h.gate.nextMix(h.o.SteadyLeaderShare, h.currentPhase()))
	t := time.AfterFunc(h.o.PhaseWindow, func() { h.setFaultsOn(false, "") })
	return func() bool { return !t.Stop() }
}

// finishRound completes the round the faults interrupted (the phase that was running, then the
// rest of the round, so that every Module ends deleted), and returns the phase it converged in.
func (h *harness) finishRound(ctx context.Context) (string, error) {
	cur := h.currentPhase()
	if cur == "" {
		return "", h.waitConverged(ctx, PhaseDelete)
	}
	// The interrupted phase's actions were done: wait for it, then run the rest of the round.
	if err := h.waitConverged(ctx, cur); err != nil {
		return cur, err
	}
	i := slices.Index(Phases, cur)
	for _, p := range Phases[i+1:] {
		h.setPhase(p)
		if err := h.phase(ctx, p); err != nil {
			return p, err
		}
	}
	return cur, nil
}

// quiet ends every fault: proxies healed and clean.
func (h *harness) quiet() {
	for _, r := range h.replicas {
		r.proxy.setFaults(ProxyFaults{})
		r.proxy.heal()
	}
}

func (h *harness) violated() bool {
	_, v, _ := h.watch.result()
	return len(v) > 0
}

// takeWrites sums and resets the proxies' write counts.
func (h *harness) takeWrites() map[string]int {
	out := map[string]int{}
	for _, r := range h.replicas {
		for k, v := range r.proxy.takeWrites() {
			out[k] += v
		}
	}
	return out
}

// perPair divides writes by pairs and rounds: writes per pair per round.
func (h *harness) perPair(w map[string]int, rounds int) float64 {
	n := 0
	for _, v := range w {
		n += v
	}
	return float64(n) / float64(h.o.Nodes*h.o.Modules*rounds)
}

// cordonsLeft lists the nodes still cordoned.
func (h *harness) cordonsLeft(ctx context.Context) []string {
	var out []string
	_ = h.retry(ctx, "reading nodes", func(ctx context.Context) error {
		out = nil
		pending, err := h.unconverged(ctx, PhaseDelete)
		for _, p := range pending {
			if len(p) > 5 && p[:5] == "node " {
				out = append(out, p)
			}
		}
		return err
	})
	return out
}
