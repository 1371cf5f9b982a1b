// Command manager is the kmm operator: it runs the controllers and the admission webhook that keep
// kernel modules loaded on the nodes that need them.
package main

import (
	"context"
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
	a, err := app.ParseArgs(args)
	if err != nil {
		return err
	}
	log, err := logging.New(logOut, a.LogLevel, a.LogConsole)
	if err != nil {
		return err
	}
	ctrl.SetLogger(log)
	klog.SetLogger(log)

	cfg, err := restConfig(a.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	mgr, err := app.New(cfg, a.Options)
	if err != nil {
		return err
	}
	log.Info("Starting the manager", "metrics", a.MetricsAddr, "metricsSecure", a.MetricsSecure, "probes", a.ProbeAddr,
		"leaderElection", a.LeaderElect, "certManagement", a.CertManagement, "workerImage", a.WorkerImage,
		"workerDryRunSandbox", a.WorkerDryRunSandbox)
	return mgr.Start(ctx)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}
