package chaos

import (
	"context"
	"slices"
	"sync"
	"time"
)

// inject starts one goroutine per fault kind (the request faults are proxy shares); they end with ctx.
func (h *harness) inject(ctx context.Context, wg *sync.WaitGroup) {
	on := func(kind string) bool { return slices.Contains(h.o.Faults, kind) }
	pf := h.o.Proxy
	if !on(FaultThrottle) {
		pf.Throttle = 0
	}
	if !on(FaultServerError) {
		pf.ServerError = 0
	}
	if !on(FaultConflict) {
		pf.Conflict = 0
	}
	if !on(FaultDelay) {
		pf.Delay = 0
	}
	for _, r := range h.replicas {
		r.proxy.setFaults(pf)
	}
	loops := map[string]func(context.Context){
		FaultKill: h.killOne, FaultPartition: h.partitionLeader, FaultWatchCut: h.cutWatches,
		FaultAPIServerRestart: func(ctx context.Context) { h.restart(ctx, "kube-apiserver", FaultAPIServerRestart) },
		FaultEtcdRestart:      func(ctx context.Context) { h.restart(ctx, "etcd", FaultEtcdRestart) },
	}
	for kind, f := range loops {
		if !on(kind) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(h.jitter(h.o.Intervals[kind])):
				}
				f(ctx)
			}
		}()
	}
}

// killOne kills the leader (three times in four) or the other replica.
func (h *harness) killOne(context.Context) {
	target := h.replicas[h.pick(len(h.replicas))]
	if leader := h.leader(); leader != nil && h.pick(4) > 0 {
		target = leader
	}
	if target.kill() {
		h.faulted(FaultKill)
	}
}

// leader is the replica holding the Lease (nil when none).
func (h *harness) leader() *replica {
	name := h.leases.current()
	for _, r := range h.replicas {
		if r.name == name {
			return r
		}
	}
	return nil
}

// partitionLeader stops the leader's traffic until another replica holds the Lease (or four lease
// durations passed), then restores it.
func (h *harness) partitionLeader(ctx context.Context) {
	r := h.leader()
	if r == nil {
		return
	}
	r.proxy.partition()
	defer r.proxy.heal()
	deadline := time.Now().Add(4 * h.o.LeaseDuration)
	for h.leases.current() == r.name && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	if h.leases.current() != r.name {
		h.faulted(FaultPartition)
	}
}

// cutWatches cuts the watch streams of one replica.
func (h *harness) cutWatches(context.Context) {
	r := h.replicas[h.pick(len(h.replicas))]
	if n := r.proxy.cutWatches(); n > 0 {
		h.counts.addN(FaultWatchCut, n-1)
		h.faulted(FaultWatchCut)
	}
}

// restart kills a control-plane process and starts it again, one at a time.
func (h *harness) restart(ctx context.Context, name, kind string) {
	h.planeMu.Lock()
	defer h.planeMu.Unlock()
	p := h.plane[name]
	ready := etcdReady(p)
	if name == "kube-apiserver" {
		var err error
		if ready, err = apiserverReady(h.cfg); err != nil {
			return
		}
	}
	// Restarts are not cut short by the end of the fault phase: a process left down would be a
	// fault of the harness.
	d, err := p.restart(context.WithoutCancel(ctx), ready)
	if err != nil {
		h.sayf("restarting %s: %v", name, err)
		return
	}
	h.downtime[name] = append(h.downtime[name], d)
	h.faulted(kind)
}

// downtimes are the median and longest downtime of each restarted process, in seconds.
func (h *harness) downtimes() map[string][2]float64 {
	h.planeMu.Lock()
	defer h.planeMu.Unlock()
	out := map[string][2]float64{}
	for name, ds := range h.downtime {
		s := slices.Clone(ds)
		slices.Sort(s)
		out[name] = [2]float64{s[len(s)/2].Seconds(), s[len(s)-1].Seconds()}
	}
	return out
}

// setPhase and currentPhase track the phase the rounds are in.
func (h *harness) setPhase(p string) {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	h.curPhase = p
	h.watch.setDrainCheck(p == PhaseUpgrade)
}

func (h *harness) currentPhase() string {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	return h.curPhase
}
