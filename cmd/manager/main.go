// Command manager is the kmm operator: it runs the controllers and the admission webhook that keep
// kernel modules loaded on the nodes that need them.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/internal/logging"
)

func main() {
	if err := run(ctrl.SetupSignalHandler(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kmm manager:", err)
		os.Exit(1)
	}
}

// run parses args, builds the manager and runs it until ctx is done.
func run(ctx context.Context, args []string, logOut io.Writer) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	opts := app.DefaultOptions()
	opts.BindFlags(fs)
	kubeconfig := fs.String("kubeconfig", "", "Path to a kubeconfig; default: $KUBECONFIG, in-cluster config, then ~/.kube/config.")
	logLevel := fs.String("log-level", "info", "Log level: debug, info, warn or error.")
	logConsole := fs.Bool("log-console", false, "Log human-readable text instead of JSON.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := logging.New(logOut, *logLevel, *logConsole)
	if err != nil {
		return err
	}
	ctrl.SetLogger(log)
	klog.SetLogger(log)

	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	mgr, err := app.New(cfg, opts)
	if err != nil {
		return err
	}
	log.Info("Starting the manager", "metrics", opts.MetricsAddr, "probes", opts.ProbeAddr, "leaderElection", opts.LeaderElect)
	return mgr.Start(ctx)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}
