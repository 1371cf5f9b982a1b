// Command kmm-manager-seeded is the kmm operator (cmd/manager/app, run as cmd/manager runs it)
// with the seeded bugs of test/chaos/seededbug planted: the ones the environment variable
// KMM_CHAOS_BUGS names, a comma-separated list. With none named it is cmd/manager. test/chaos's
// TestSeededBugs builds and runs it; it ships nowhere.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/internal/logging"
	"github.com/kmm-project/kmm/test/chaos/seededbug"
)

func main() {
	if err := run(ctrl.SetupSignalHandler(), os.Args[1:], os.Getenv(seededbug.EnvVar), os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kmm manager (seeded bugs):", err)
		os.Exit(1)
	}
}

// run parses args, builds the manager with the bugs planted and runs it until ctx is done.
func run(ctx context.Context, args []string, bugList string, logOut io.Writer) error {
	bugs, err := seededbug.Parse(bugList)
	if err != nil {
		return err
	}
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
	cfg, err := clientcmd.BuildConfigFromFlags("", a.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	seededbug.Plant(cfg, &a.Options, bugs)
	mgr, err := app.New(cfg, a.Options)
	if err != nil {
		return err
	}
	log.Info("Starting the manager with seeded bugs", "bugs", bugList, "leaderElection", a.LeaderElect)
	return mgr.Start(ctx)
}
