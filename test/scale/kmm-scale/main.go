// Command kmm-scale is the scale harness (test/scale): it runs the operator binary against a local
// control plane with simulated nodes, prints a table and writes the results as JSON.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kmm-project/kmm/test/scale"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kmm-scale:", err)
		os.Exit(1)
	}
}

func run() error {
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	o := scale.Options{Log: os.Stderr}
	flag.IntVar(&o.Nodes, "nodes", 1000, "Simulated nodes.")
	flag.IntVar(&o.Modules, "modules", 3, "Modules, each selecting every node.")
	flag.StringVar(&o.Manager, "manager", "bin/manager", "The operator binary.")
	flag.IntVar(&o.AgentWorkers, "agent-workers", 16, "Worker pods the simulated kubelet ends at once.")
	flag.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "Longest a phase may take.")
	flag.IntVar(&o.ProfileSeconds, "profile-seconds", 0, "When positive, save CPU profiles of the operator and kube-apiserver over the first seconds of the load phase.")
	flag.StringVar(&o.ProfilePhase, "profile-phase", "load", "The phase --profile-seconds profiles: load, or idle (the first seconds of its window).")
	phases := flag.String("phases", "load,resync,bump,floor", "Phases to run, comma-separated; the others need load.")
	floor := flag.String("floor-concurrency", "16,64", "The floor phase's runs: how many nodes each works on at once, comma-separated.")
	out := flag.String("out", "bin/scale", "Directory of the JSON result, the operator logs and profiles.")
	args := flag.String("operator-args", "", "Extra operator flags, space-separated (e.g. \"--kube-api-qps 200\").")
	pulls := flag.String("pull-times", "", "Worker pods run for a seeded long-tailed time in MIN-MAX (e.g. 2s-30s; issue 41, item 4); empty: they end at once.")
	seed := flag.Int64("seed", 1, "Seed of --pull-times.")
	busyOnly := flag.Bool("busy-only", false, "With --busy: the busy cluster only, without the empty one before it (no busy/empty comparison).")
	busy := flag.Bool("busy", false, "A cluster that is not empty (issue 41, item 3): the phases (load,idle,newmodule unless --phases says otherwise) first in an empty cluster, then in a busy one, each on a control plane of its own.")
	var b scale.Busy
	flag.IntVar(&b.PodsPerNode, "busy-pods", 30, "With --busy: unrelated pods per node.")
	flag.Float64Var(&b.Churn, "busy-churn", 0, "With --busy: unrelated pods replaced per second (0: nodes/100).")
	flag.DurationVar(&b.Idle, "busy-idle", 60*time.Second, "With --busy: how long the idle phase watches the operator.")
	flag.DurationVar(&b.LeasePeriod, "lease-period", 10*time.Second, "With --busy: how often the simulated kubelet renews each node's Lease.")
	flag.DurationVar(&b.StatusPeriod, "status-period", 60*time.Second, "With --busy: how often the simulated kubelet posts each node's status.")
	flag.Parse()
	var err error
	if o.PullTimes, err = scale.ParsePullTimes(*pulls, *seed); err != nil {
		return err
	}
	o.OperatorArgs = strings.Fields(*args)
	o.Phases = strings.Split(*phases, ",")
	phasesSet := false
	flag.Visit(func(f *flag.Flag) { phasesSet = phasesSet || f.Name == "phases" })
	if o.FloorConcurrency, err = parseFloor(*floor); err != nil {
		return err
	}
	if o.OutDir, err = filepath.Abs(*out); err != nil {
		return err
	}
	if o.Manager, err = filepath.Abs(o.Manager); err != nil {
		return err
	}
	if err := os.MkdirAll(o.OutDir, 0o750); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !*busy {
		_, err := runOne(ctx, o, "")
		return err
	}
	return runBusy(ctx, o, b, phasesSet, *busyOnly)
}

// parseFloor reads --floor-concurrency.
func parseFloor(list string) ([]int, error) {
	var out []int
	for _, c := range strings.Split(list, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--floor-concurrency: %q is not a positive number", c)
		}
		out = append(out, n)
	}
	return out, nil
}

// runBusy runs the phases in an empty cluster, then in a busy one, and compares their loads.
func runBusy(ctx context.Context, o scale.Options, b scale.Busy, phasesSet, busyOnly bool) error {
	if !phasesSet {
		o.Phases = []string{"load", "idle", "newmodule"}
	}
	if busyOnly {
		o.Busy = &b
		_, err := runOne(ctx, o, "busy-")
		return err
	}
	empty := o
	e, err := runOne(ctx, empty, "empty-")
	if err != nil {
		return err
	}
	o.Busy = &b
	r, err := runOne(ctx, o, "busy-")
	if err != nil {
		return err
	}
	for _, name := range []string{"load", "newmodule"} {
		if el, bl := phase(e, name), phase(r, name); el != nil && bl != nil && el.Seconds > 0 {
			fmt.Printf("busy cluster, %s: %.1f s against %.1f s in the empty cluster = %.2fx (settled %.1f s against %.1f s)\n",
				name, bl.Seconds, el.Seconds, bl.Seconds/el.Seconds, bl.SettledSeconds, el.SettledSeconds)
		}
	}
	return nil
}

// runOne runs the harness once and writes its result to OutDir/<prefix>result-NxM.json.
func runOne(ctx context.Context, o scale.Options, prefix string) (*scale.Result, error) {
	res, err := scale.Run(ctx, o)
	if res != nil {
		path := filepath.Join(o.OutDir, fmt.Sprintf("%sresult-%dx%d.json", prefix, o.Nodes, o.Modules))
		if werr := res.WriteJSON(path); werr != nil {
			return res, werr
		}
		res.PrintTable(os.Stdout)
		fmt.Println("JSON:", path)
	}
	return res, err
}

// phase is the phase of r called name, nil when it did not run.
func phase(r *scale.Result, name string) *scale.Phase {
	for i := range r.Phases {
		if r.Phases[i].Name == name {
			return &r.Phases[i]
		}
	}
	return nil
}
