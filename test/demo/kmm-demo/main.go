// Command kmm-demo runs kmm end to end on a local control plane built by the project (see package
// test/demo): `make demo` builds the worker and kubectl-kmm binaries and runs it. It exits 0 with a
// summary when every step was proven, and non-zero with the reason otherwise; it cleans up every
// process and temporary directory, also on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kmm-project/kmm/test/demo"
)

func main() {
	workerBin := flag.String("worker", "bin/worker", "The kmm worker binary.")
	kubectlKMM := flag.String("kubectl-kmm", "bin/kubectl-kmm", "The kubectl-kmm plugin binary.")
	nodes := flag.Int("nodes", 3, "Simulated nodes.")
	timeout := flag.Duration("step-timeout", 90*time.Second, "Longest wait of one step.")
	flag.Parse()
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	_, err := demo.Run(ctx, demo.Options{WorkerBinary: *workerBin, KubectlKMM: *kubectlKMM, Nodes: *nodes, Out: os.Stdout, StepTimeout: *timeout})
	if err != nil {
		fmt.Fprintf(os.Stderr, "\nkmm demo FAILED after %.0fs: %v\n", time.Since(start).Seconds(), err)
		os.Exit(1)
	}
	fmt.Printf("\nkmm demo passed in %.0fs: everything was cleaned up.\n", time.Since(start).Seconds())
}
