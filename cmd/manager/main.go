// Command manager is the kmm operator: it runs the controllers and the admission webhook that keep
// kernel modules loaded on the nodes that need them.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kmm-project/kmm/internal/logging"
	"github.com/kmm-project/kmm/internal/manager"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kmm manager:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	opts := manager.DefaultOptions()
	opts.BindFlags(fs)
	logLevel := fs.String("log-level", "info", "Log level: debug, info, warn or error.")
	logConsole := fs.Bool("log-console", false, "Log human-readable text instead of JSON.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := logging.New(os.Stderr, *logLevel, *logConsole)
	if err != nil {
		return err
	}
	ctrl.SetLogger(log)
	klog.SetLogger(log)

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return err
	}
	log.Info("Starting the manager", "metrics", opts.MetricsAddr, "probes", opts.ProbeAddr, "leaderElection", opts.LeaderElect)
	return mgr.Start(ctrl.SetupSignalHandler())
}
