// Command kubectl-kmm is the kubectl plugin of the kmm operator (`kubectl kmm`, once the binary is on
// PATH). It reads Modules and NodeModulesConfigs and prints, per (node, module) pair, the state of
// the operator's state machine, since when and why (status, and with -w every change as it
// happens), the pair's transition log (history), and the state machine itself (diagram).
//
// It is built like kubectl's own commands: github.com/spf13/cobra for commands, flags and shell
// completion, and k8s.io/cli-runtime for kubectl's connection flags (genericclioptions.ConfigFlags:
// --kubeconfig, --context, --as, --server, --token, ...) and its printers (-o json, yaml, name,
// jsonpath=..., go-template=...). Each subcommand lives in its own file (cmd_<name>.go) and is
// added to the root command in root.go.
//
// The rendering is pure (Modules, NMCs and the current time in; rows and text out) and tested with
// tables; run is the whole command, tested against a real API server with the operator running.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	// client-go and controller-runtime log only for the operator's benefit; a CLI reports errors.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
