package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// statusOptions are the flags of `kubectl kmm status`.
type statusOptions struct {
	*rootOptions
	print *genericclioptions.PrintFlags
	watch bool
}

func newStatusCommand(root *rootOptions) *cobra.Command {
	o := &statusOptions{rootOptions: root, print: genericclioptions.NewPrintFlags("")}
	cmd := &cobra.Command{
		Use:   "status [<namespace>/<module> | <module>]",
		Short: "One row per (node, module) pair: state, time in it, attempts and reason",
		Long: "One row per (node, module) pair: state, time in it, attempts and reason, below a summary of\n" +
			"each Module. Without a module it shows every Module (of one namespace with -n).\n" +
			"With -w it then prints a row each time a pair's state or reason changes, until interrupted.",
		Example: "  kubectl kmm status\n  kubectl kmm status drivers/nic -o wide\n  kubectl kmm status -w\n" +
			"  kubectl kmm status -o jsonpath='{range .items[*]}{.node} {.module} {.state}{\"\\n\"}{end}'",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return errors.New("status takes at most one module: kubectl kmm status [<namespace>/<module>]")
			}
			return nil
		},
		ValidArgsFunction: root.completeModules,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args)
		},
	}
	addPrintFlags(cmd, o.print, outputWide)
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false,
		"After the table, print a row each time a pair's state or reason changes (until interrupted).")
	return cmd
}

func (o *statusOptions) run(ctx context.Context, args []string) error {
	printer, err := printerFor(o.print, outputWide)
	if err != nil {
		return err
	}
	s, err := o.connect()
	if err != nil {
		return err
	}
	filter := moduleFilter{namespace: *o.config.Namespace}
	if len(args) == 1 {
		if filter, err = moduleArg(args[0], s.namespace); err != nil {
			return err
		}
	}
	view, err := s.statusView(ctx, filter)
	if err != nil {
		return err
	}
	if o.watch {
		return o.follow(ctx, s, filter, view, printer)
	}
	out := o.streams.Out
	if printer != nil {
		return printRows(printer, o.print, out, view.rows, func(r PairRow) string { return r.Node })
	}
	_, err = io.WriteString(out, o.statusText(view, filter))
	return err
}

// statusText is the status table, or what an empty one means.
func (o *statusOptions) statusText(view *statusView, filter moduleFilter) string {
	wide := *o.print.OutputFormat == outputWide
	if len(view.rows) > 0 {
		return renderStatus(view.summaries, view.rows, o.tableWidth(), wide)
	}
	if view.noNMC && filter.name == "" {
		return renderSummaries(view.summaries, o.tableWidth(), wide) + noNMCMessage
	}
	return renderSummaries(view.summaries, o.tableWidth(), wide) + noPairsMessage(filter)
}

// noPairsMessage explains an empty status table.
func noPairsMessage(f moduleFilter) string {
	if f.name != "" {
		return fmt.Sprintf("No node has an entry for %s/%s: its selector matches no node, or no kernel mapping "+
			"matches the kernels of the nodes it selects (see Degraded above).\n", f.namespace, f.name)
	}
	return "No (node, module) pairs.\n"
}

// moduleArg resolves "<namespace>/<name>" or "<name>" (in the -n or kubeconfig namespace).
func moduleArg(arg, namespace string) (moduleFilter, error) {
	ns, name, qualified := strings.Cut(arg, "/")
	if !qualified {
		return moduleFilter{namespace: namespace, name: arg}, nil
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return moduleFilter{}, fmt.Errorf("module %q: want <namespace>/<name> or <name> with -n <namespace>", arg)
	}
	return moduleFilter{namespace: ns, name: name}, nil
}
