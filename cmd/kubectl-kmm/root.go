package main

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// defaultWidth is the terminal width assumed when neither --width nor $COLUMNS says otherwise.
const defaultWidth = 100

// defaultRequestTimeout bounds each API request unless --request-timeout says otherwise (kubectl's
// default is no timeout; a status command should not hang on an unreachable server).
const defaultRequestTimeout = 30 * time.Second

// rootOptions is what every subcommand shares: the streams, kubectl's connection flags and the
// width tables fit. A subcommand's constructor takes it (newStatusCommand(o), ...).
type rootOptions struct {
	streams genericiooptions.IOStreams
	// config holds kubectl's connection flags (--kubeconfig, --context, -n, --as, --server, ...).
	config *genericclioptions.ConfigFlags
	width  int
	// watchHooks are test hooks of status -w (nil outside tests).
	watchHooks *watchHooks
}

// newRootCommand builds `kubectl kmm` with its subcommands. To add a subcommand, write its
// constructor in cmd_<name>.go, taking *rootOptions, and add it to the AddCommand call below.
func newRootCommand(streams genericiooptions.IOStreams) *cobra.Command {
	return newRootOptions(streams).command()
}

// newRootOptions has kubectl's connection flags with their defaults, but for --request-timeout.
func newRootOptions(streams genericiooptions.IOStreams) *rootOptions {
	o := &rootOptions{streams: streams, config: genericclioptions.NewConfigFlags(true)}
	*o.config.Timeout = defaultRequestTimeout.String()
	return o
}

func (o *rootOptions) command() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kmm",
		Short: "Show what the kmm operator is doing with each (node, module) pair",
		Long: "kubectl kmm shows what the kmm operator is doing with each (node, module) pair: its state,\n" +
			"since when and why (status, status -w to follow changes), its transition log (history),\n" +
			"the state machine the operator runs (diagram), whether every Module is served on a kernel\n" +
			"before an upgrade (preflight), and the automatic rollout of a Module's version (rollout).",
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl kmm"},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(o.streams.ErrOut)
			_ = cmd.Usage()
			return errors.New("missing command: status, history, diagram, preflight or rollout")
		},
	}
	cmd.SetIn(o.streams.In)
	cmd.SetOut(o.streams.Out)
	cmd.SetErr(o.streams.ErrOut)
	o.config.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().IntVar(&o.width, "width", 0, "Terminal width the tables fit (default: $COLUMNS, else 100).")
	o.registerFlagCompletions(cmd)
	cmd.AddCommand(
		newStatusCommand(o),
		newHistoryCommand(o),
		newDiagramCommand(o),
		newPreflightCommand(o),
		newRolloutCommand(o),
	)
	return cmd
}

// run is the whole command as main runs it, with args (without the program name) and the output
// streams given: the tests' entry point.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runWith(ctx, args, stdout, stderr, nil)
}

// runWith is run with test hooks for status -w.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, hooks *watchHooks) error {
	o := newRootOptions(genericiooptions.IOStreams{In: nil, Out: stdout, ErrOut: stderr})
	o.watchHooks = hooks
	cmd := o.command()
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}

// tableWidth is the width tables must fit: --width, else $COLUMNS, else defaultWidth.
func (o *rootOptions) tableWidth() int {
	if o.width > 0 {
		return o.width
	}
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		return c
	}
	return defaultWidth
}
