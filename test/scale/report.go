package scale

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
)

// Machine describes where a run happened.
type Machine struct {
	CPUs      int     `json:"cpus"`
	CPUModel  string  `json:"cpuModel"`
	MemoryGiB float64 `json:"memoryGiB"`
	GoVersion string  `json:"goVersion"`
}

// DescribeMachine reads the CPU model and memory from /proc.
func DescribeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(data), "MemTotal: %f kB", &kb); err == nil {
			m.MemoryGiB = kb / (1 << 20)
		}
	}
	return m
}

// WriteJSON writes r as indented JSON to path.
func (r *Result) WriteJSON(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o600)
}

// PrintTable prints one row per phase and the operator's requests by verb and resource.
func (r *Result) PrintTable(w io.Writer) {
	_, _ = fmt.Fprintf(w, "kmm scale: %d nodes x %d modules = %d pairs; %d CPUs (%s), %.0f GiB, %s\n",
		r.Nodes, r.Modules, r.Pairs, r.Machine.CPUs, r.Machine.CPUModel, r.Machine.MemoryGiB, r.Machine.GoVersion)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = fmt.Fprintln(tw, "phase\tseconds\tsettled s\top writes\twrites/pair\tw/o Events\treconciles\tCPU s\tµs CPU/reconcile\tpeak RSS MiB\t")
	for _, p := range r.Phases {
		rec := 0
		for _, n := range p.Reconciles {
			rec += n
		}
		_, _ = fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%d\t%.2f\t%.2f\t%d\t%.1f\t%.0f\t%.0f\t\n", p.Name, p.Seconds, p.SettledSeconds,
			p.OperatorWrites, p.WritesPerPair, p.WritesPerPairNoEvents, rec, p.CPUSeconds, p.CPUPerReconcileMicros, p.PeakRSSMiB)
	}
	_ = tw.Flush()
	for _, p := range r.Phases {
		if p.Name == "resync" || p.Name == "idle" || p.Seconds <= 0 {
			continue
		}
		per := p.Seconds / float64(r.Pairs) * 1000
		_, _ = fmt.Fprintf(w, "%s: %.1f s per 1,000 pairs; the upstream operator's reference, a load of 1,000 nodes x 1 Module on the same kind of harness: %.1f s (%.1fx)\n",
			p.Name, per, UpstreamReferenceSeconds, UpstreamReferenceSeconds/per)
	}
	_, _ = fmt.Fprintf(w, "one NMC after the load: %d bytes of JSON (managedFields included)\n", r.NMCBytes)
	if f := r.Floor; f != nil {
		_, _ = fmt.Fprintf(w, "floor: kmm's load %.1f s / the fastest floor's (%s) %.1f s = %.2fx (target <= 1.25x); until the last write %.2fx\n",
			f.LoadSeconds, f.Phase, f.FloorSeconds, f.Ratio, f.SettledRatio)
	}
	for _, p := range r.Phases {
		if p.Name == "idle" && p.Seconds > 0 {
			printIdle(w, p)
		}
	}
	for _, p := range r.Phases {
		_, _ = fmt.Fprintf(w, "operator requests, %s: %s\n", p.Name, p.OperatorRequests)
		_, _ = fmt.Fprintf(w, "operator writes per pair, %s: %.2f in all (Events included): %s\n", p.Name, p.WritesPerPair, perPair(p.WritesPerPairByKind))
		_, _ = fmt.Fprintf(w, "mean request body bytes, %s (all clients): %s\n", p.Name, perPair(p.BodyBytesPerWrite))
		if st := p.Stages; st != nil {
			_, _ = fmt.Fprintf(w, "stages per pair, %s (s, p50/p90/max): start to Loading seen %s, Loading to pod ended %s, pod ended to Loaded seen %s\n",
				p.Name, st.ToLoading, st.LoadingToEnded, st.EndedToLoaded)
		}
		if q := p.Queues; len(q) > 0 {
			_, _ = fmt.Fprintf(w, "work queues, %s: %s\n", p.Name, queueLine(q))
		}
		if t := p.Tail; t != nil {
			_, _ = fmt.Fprintf(w, "pull times, %s: worker pods ran %s s (p50/p90/max); the last ended at %.1f s, every pair Loaded at %.1f s: %.1f s after it (target <= 2 s)\n",
				p.Name, t.PullSeconds, t.LastPodEndedSeconds, t.LoadedSeconds, t.AfterLastPodSeconds)
		}
		_, _ = fmt.Fprintf(w, "kube-apiserver, %s: %.1f ms CPU per pair; %.0f bytes per NMC status write\n", p.Name,
			p.APIServerCPUMillisPerPair, p.NMCStatusWriteBytes)
		_, _ = fmt.Fprintf(w, "harness+agent requests, %s: %s\n", p.Name, p.HarnessRequests.writesOnly())
		_, _ = fmt.Fprintf(w, "CPU seconds, %s: operator %.1f, kube-apiserver %.1f, etcd %.1f, harness+agent %.1f; %.2f of %d cores busy\n", p.Name,
			p.CPUSeconds, p.OtherCPUSeconds["kube-apiserver"], p.OtherCPUSeconds["etcd"], p.OtherCPUSeconds["harness+agent"],
			p.CoresBusy(), r.Machine.CPUs)
	}
}

// CoresBusy is the CPU time of every process of the phase (operator, kube-apiserver, etcd,
// harness and agent) over its settled wall time: at the machine's core count the phase was bound
// by CPU, and its time follows the work asked of the control plane rather than any wait in kmm.
func (p *Phase) CoresBusy() float64 {
	if p.SettledSeconds <= 0 {
		return 0
	}
	total := p.CPUSeconds
	for _, s := range p.OtherCPUSeconds {
		total += s
	}
	return total / p.SettledSeconds
}

// queueLine lists the queues of the NMC and Module controllers: items, mean wait, mean work.
func queueLine(qs map[string]Queue) string {
	var parts []string
	for _, name := range []string{"nmc", "module"} {
		if q, ok := qs[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %d items, waited %.0f ms, worked %.0f ms (mean), %.1f worker-s", name, q.Items, q.MeanWaitMs, q.MeanWorkMs, q.BusyWorkersS))
		}
	}
	return strings.Join(parts, "; ")
}

// perPair lists per-pair (or per-request) figures, largest first, with two decimals.
func perPair(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.2f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// UpstreamReferenceSeconds is the upstream KMM operator's time to load 1,000 simulated nodes x 1
// Module on the same kind of harness (issue 22, measured side by side with kmm): the reference
// every run is compared with, per 1,000 pairs.
const UpstreamReferenceSeconds = 149.9

// writesOnly keeps the writes.
func (r Requests) writesOnly() Requests {
	out := Requests{}
	for k, v := range r {
		if isWrite(k) {
			out[k] = v
		}
	}
	return out
}

// String lists the counts, largest first.
func (r Requests) String() string {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if r[keys[i]] != r[keys[j]] {
			return r[keys[i]] > r[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r[k]))
	}
	return strings.Join(parts, ", ")
}

// printIdle prints the idle phase's line: the operator's CPU, writes, reconciles and peak RSS, and
// its CPU per 1,000 node status posts of a busy cluster.
func printIdle(w io.Writer, p Phase) {
	_, _ = fmt.Fprintf(w, "idle (no Module change): operator CPU %.2f s over %.0f s = %.1f %% of a core (target < 5 %%), %d NMC and Node writes (target 0) of %d operator writes (%s), reconciles %v, peak RSS %.0f MiB; %d unrelated pods replaced (%.1f/s)\n",
		p.CPUSeconds, p.Seconds, p.CPUSeconds/p.Seconds*100, p.OperatorWrites-p.OperatorRequests.writes("nodemodulesconfigs", "nodes"), p.OperatorWrites,
		p.OperatorRequests.writesOnly(), p.Reconciles, p.PeakRSSMiB, p.ChurnedPods, float64(p.ChurnedPods)/p.Seconds)
	if posts := p.HarnessRequests[nodeStatusPost]; posts > 0 {
		_, _ = fmt.Fprintf(w, "idle: %d node status posts (%.1f/s): operator CPU %.2f s per 1,000 posts\n",
			posts, float64(posts)/p.Seconds, p.CPUSeconds/float64(posts)*1000)
	}
}

// nodeStatusPost is the simulated kubelet's status post of a Node (Busy), as the harness counts it.
const nodeStatusPost = "PUT nodes/status"
