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
	h.proxyFaults = pf
	h.setFaultsOn(true, MixAll)
	loops := map[string]func(context.Context){
		FaultKill: h.killOne, FaultPartition: h.partitionLeader, FaultWatchCut: h.cutWatches,
		FaultAPIServerRestart: h.restartAPIServer,
		FaultEtcdRestart:      h.restartEtcd,
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
				if h.gate.wait(ctx, kind) {
					f(ctx)
				}
			}
		}()
	}
}

// killOne kills the leader (Options.LeaderKills of the time) or another replica.
func (h *harness) killOne(context.Context) {
	target := h.replicas[h.pick(len(h.replicas))]
	if leader := h.leader(); leader != nil {
		target = leader
		if h.pick(1000) >= int(h.o.LeaderKills*1000) {
			target = h.other(leader)
		}
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

// other is a replica other than r, drawn at random (r itself when it is the only one).
func (h *harness) other(r *replica) *replica {
	var others []*replica
	for _, x := range h.replicas {
		if x != r {
			others = append(others, x)
		}
	}
	if len(others) == 0 {
		return r
	}
	return others[h.pick(len(others))]
}

// partitionLeader stops the leader's traffic until it lost its Lease (it exits, as a manager
// does when it cannot renew within the renew deadline) or another replica holds the Lease, then
// restores it; it gives up after four lease durations. When no replica is leading (the last one
// lost the Lease, the next has not taken it yet) it waits up to two lease durations for one.
func (h *harness) partitionLeader(ctx context.Context) {
	r := h.renewingLeader(ctx, 2*h.o.LeaseDuration)
	if r == nil {
		return
	}
	exits := r.exitsOnLostLease()
	r.proxy.partition()
	defer r.proxy.heal()
	deadline := time.Now().Add(4 * h.o.LeaseDuration)
	lost := func() bool { return h.leases.current() != r.name || r.exitsOnLostLease() > exits }
	for !lost() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	if lost() {
		h.faulted(FaultPartition)
	}
}

// renewingLeader is the replica holding the Lease and renewing it, waiting up to wait for one
// (nil if none by then, when ctx ends, or when the gate stops partitions meanwhile).
func (h *harness) renewingLeader(ctx context.Context, wait time.Duration) *replica {
	deadline := time.Now().Add(wait)
	for {
		if r := h.leader(); r != nil && h.leases.renewing(h.o.RenewDeadline) == r.name {
			return r
		}
		if time.Now().After(deadline) || !h.gate.allows(FaultPartition) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
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

// restartEtcd kills etcd and starts it again (same data directory and ports).
func (h *harness) restartEtcd(ctx context.Context) {
	if h.etcds == nil {
		h.restartPlane(ctx, "etcd", FaultEtcdRestart)
		return
	}
	// One member at a time: the other two keep the quorum (a restart of the raft leader is an
	// election).
	h.planeMu.Lock()
	defer h.planeMu.Unlock()
	m := h.etcds.members[h.pick(len(h.etcds.members))]
	d, err := m.restart(context.WithoutCancel(ctx), etcdReady(m))
	h.recordRestart("etcd", FaultEtcdRestart, d, err)
}

// restartPlane restarts etcd or the single kube-apiserver (without the balancer), one at a time.
func (h *harness) restartPlane(ctx context.Context, name, kind string) {
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
	h.recordRestart(name, kind, d, err)
}

// restartAPIServer starts the rolling restart of one kube-apiserver instance, in the background,
// when another one is left serving: restarts of different instances overlap.
func (h *harness) restartAPIServer(ctx context.Context) {
	if h.apis == nil {
		h.restartPlane(ctx, "kube-apiserver", FaultAPIServerRestart)
		return
	}
	i := h.apis.claim(h.pick)
	if i < 0 {
		return
	}
	h.restarts.Add(1)
	go func() {
		defer h.restarts.Done()
		d, err := h.apis.restart(context.WithoutCancel(ctx), i)
		h.planeMu.Lock()
		defer h.planeMu.Unlock()
		h.recordRestart("kube-apiserver", FaultAPIServerRestart, d, err)
	}()
}

// recordRestart records a restart's downtime and counts it (h.planeMu held).
func (h *harness) recordRestart(name, kind string, d time.Duration, err error) {
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
	h.counts.setPhase(p)
	h.watch.setDrainCheck(p == PhaseUpgrade)
}

func (h *harness) currentPhase() string {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	return h.curPhase
}
