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
	phases := flag.String("phases", "load,resync,bump,floor", "Phases to run, comma-separated; the others need load.")
	floor := flag.String("floor-concurrency", "16,64", "The floor phase's runs: how many nodes each works on at once, comma-separated.")
	out := flag.String("out", "bin/scale", "Directory of the JSON result, the operator logs and profiles.")
	args := flag.String("operator-args", "", "Extra operator flags, space-separated (e.g. \"--kube-api-qps 200\").")
	flag.Parse()
	o.OperatorArgs = strings.Fields(*args)
	o.Phases = strings.Split(*phases, ",")
	for _, c := range strings.Split(*floor, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("--floor-concurrency: %q is not a positive number", c)
		}
		o.FloorConcurrency = append(o.FloorConcurrency, n)
	}
	var err error
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
	res, err := scale.Run(ctx, o)
	if res != nil {
		path := filepath.Join(o.OutDir, fmt.Sprintf("result-%dx%d.json", o.Nodes, o.Modules))
		if werr := res.WriteJSON(path); werr != nil {
			return werr
		}
		res.PrintTable(os.Stdout)
		fmt.Println("JSON:", path)
	}
	return err
}
