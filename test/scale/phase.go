package scale

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"
)

// ignored are resources only the API server itself writes (its identity lease, flow control
// configuration): left out of the operator's requests.
var ignored = []string{"leases", "flowschemas", "prioritylevelconfigurations", "apiservices", "endpoints", "endpointslices"}

// snapshot is the counters at one instant.
type snapshot struct {
	at         time.Time
	apiserver  Requests
	harness    Requests
	reconciles map[string]int
	queues     map[string]queueSums
	bodyBytes  map[string]bodySize // request body sizes by "verb resource" (all clients)
	cpu        float64
	others     map[string]float64 // CPU seconds of the other processes (processCPU)
}

func (h *harness) snapshot(ctx context.Context, op *operator) (snapshot, error) {
	s := snapshot{at: time.Now(), reconciles: map[string]int{}, others: processCPU()}
	samples, err := scrape(ctx, h.apiserver, strings.TrimSuffix(h.env.Config.Host, "/")+"/metrics",
		"apiserver_request_total", "apiserver_request_body_size_bytes_sum", "apiserver_request_body_size_bytes_count")
	if err != nil {
		return s, fmt.Errorf("scraping the API server: %w", err)
	}
	s.apiserver = apiserverRequests(samples)
	s.bodyBytes = bodySizes(samples)
	h.count.mu.Lock()
	s.harness = maps.Clone(h.count.reqs)
	h.count.mu.Unlock()
	if op != nil {
		if s.reconciles, s.queues, err = op.counters(ctx); err != nil {
			return s, fmt.Errorf("scraping the operator: %w", err)
		}
		if _, s.cpu, err = op.stats(); err != nil {
			return s, err
		}
	}
	return s, nil
}

// measure runs action (which may start the operator into *op), waits until the operator is quiet,
// and returns what the phase cost.
func (h *harness) measure(ctx context.Context, name string, op **operator, action func(context.Context) error) (Phase, error) {
	p := Phase{Name: name}
	before, err := h.snapshot(ctx, *op)
	if err != nil {
		return p, err
	}
	h.sayf("phase %s", name)
	actx, cancel := context.WithTimeout(ctx, h.o.Timeout)
	defer cancel()
	if err := action(actx); err != nil {
		return p, fmt.Errorf("phase %s: %w", name, err)
	}
	p.Seconds = time.Since(before.at).Seconds()
	h.sayf("phase %s converged in %.1f s; waiting for the operator to settle", name, p.Seconds)
	// In a busy cluster the operator's writes, not its reconciles, say it settled: an operator
	// reconciling on every Node status post would never be quiet (the idle phase measures those).
	settleTest := quiet
	if h.o.Busy != nil {
		settleTest = noWrites
	}
	after, err := h.settleOn(actx, *op, settleTest)
	if err != nil {
		return p, fmt.Errorf("phase %s: %w", name, err)
	}
	p.SettledSeconds = after.at.Sub(before.at).Seconds()
	if name == "resync" {
		p.Seconds = p.SettledSeconds
	}
	return p, h.fill(&p, before, after, *op)
}

// fill computes a phase's figures from the snapshots at its start and end.
func (h *harness) fill(p *Phase, before, after snapshot, op *operator) error {
	p.Requests = after.apiserver.minus(before.apiserver)
	p.HarnessRequests = after.harness.minus(before.harness)
	p.OperatorRequests = Requests{}
	for k, v := range p.Requests.minus(p.HarnessRequests) {
		_, res, _ := strings.Cut(k, " ")
		if !isIgnored(res) && v > 0 {
			p.OperatorRequests[k] = v
		}
	}
	p.OperatorWrites = p.OperatorRequests.writes()
	p.EventWrites = p.OperatorWrites - p.OperatorRequests.writes("events")
	pairs := float64(h.o.Nodes * h.o.Modules)
	p.WritesPerPair = float64(p.OperatorWrites) / pairs
	p.WritesPerPairNoEvents = float64(p.OperatorWrites-p.EventWrites) / pairs
	p.WritesPerPairByKind = map[string]float64{}
	for k, v := range p.OperatorRequests {
		if isWrite(k) {
			p.WritesPerPairByKind[k] = float64(v) / pairs
		}
	}
	p.BodyBytesPerWrite = meanBodySizes(before.bodyBytes, after.bodyBytes)
	p.Reconciles = map[string]int{}
	total := 0
	for c, n := range after.reconciles {
		p.Reconciles[c] = n - before.reconciles[c]
		total += p.Reconciles[c]
	}
	p.Queues = queuesBetween(before.queues, after.queues)
	p.CPUSeconds = after.cpu - before.cpu
	p.OtherCPUSeconds = map[string]float64{}
	for name, cpu := range after.others {
		p.OtherCPUSeconds[name] = cpu - before.others[name]
	}
	if total > 0 {
		p.CPUPerReconcileMicros = p.CPUSeconds / float64(total) * 1e6
	}
	h.annotate(p, before.at, pairs)
	if op != nil {
		var err error
		if p.PeakRSSMiB, _, err = op.stats(); err != nil {
			return err
		}
	}
	h.sayf("phase %s: %.1f s, settled %.1f s, %d operator writes (%.2f per pair, %.2f without Events), %.1f CPU s, peak RSS %.0f MiB",
		p.Name, p.Seconds, p.SettledSeconds, p.OperatorWrites, p.WritesPerPair, p.WritesPerPairNoEvents, p.CPUSeconds, p.PeakRSSMiB)
	return nil
}

// annotate adds the figures derived from a phase's measurements: its stages (load, floor),
// kube-apiserver's CPU per pair and the size of an NMC status write.
func (h *harness) annotate(p *Phase, start time.Time, pairs float64) {
	switch {
	case p.Name == "load":
		st := h.stages(start, NodePrefix)
		p.Stages = &st
		if h.o.PullTimes != nil {
			p.Tail = h.tail(start, p.Seconds)
		}
	case strings.HasPrefix(p.Name, "floor"):
		st := h.stages(start, h.stagePrefix)
		p.Stages = &st
	}
	p.APIServerCPUMillisPerPair = p.OtherCPUSeconds["kube-apiserver"] / pairs * 1000
	p.NMCStatusWriteBytes = p.BodyBytesPerWrite["update nodemodulesconfigs"]
}

func isIgnored(resource string) bool {
	for _, r := range ignored {
		if resource == r || strings.HasPrefix(resource, r+"/") {
			return true
		}
	}
	return false
}

// settleOn waits until no worker pod is left and the operator was quiet for a second (quiet: no
// write and no reconcile; noWrites: no write); it returns the snapshot taken when it went quiet.
func (h *harness) settleOn(ctx context.Context, op *operator, quiet func(a, b snapshot) bool) (snapshot, error) {
	prev, err := h.snapshot(ctx, op)
	if err != nil {
		return prev, err
	}
	for {
		select {
		case <-ctx.Done():
			return prev, fmt.Errorf("the operator did not settle: %w", ctx.Err())
		case <-time.After(time.Second):
		}
		cur, err := h.snapshot(ctx, op)
		if err != nil {
			return cur, err
		}
		pods, err := h.workerPods(ctx)
		if err != nil {
			return cur, err
		}
		if pods == 0 && quiet(prev, cur) {
			return prev, nil
		}
		prev = cur
	}
}

// quiet says whether nothing but the harness and the API server's bookkeeping wrote between a
// and b, and the operator reconciled nothing.
func quiet(a, b snapshot) bool {
	return noWrites(a, b) && maps.Equal(a.reconciles, b.reconciles)
}

// noWrites says whether nothing but the harness and the API server's bookkeeping wrote between a
// and b.
func noWrites(a, b snapshot) bool {
	d := b.apiserver.minus(a.apiserver).minus(b.harness.minus(a.harness))
	for k, v := range d {
		_, res, _ := strings.Cut(k, " ")
		if isWrite(k) && v > 0 && !isIgnored(res) {
			return false
		}
	}
	return true
}
