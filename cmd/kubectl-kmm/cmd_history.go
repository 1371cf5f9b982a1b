package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// historyOptions are the flags of `kubectl kmm history`.
type historyOptions struct {
	*rootOptions
	print *genericclioptions.PrintFlags
}

func newHistoryCommand(root *rootOptions) *cobra.Command {
	o := &historyOptions{rootOptions: root, print: genericclioptions.NewPrintFlags("")}
	cmd := &cobra.Command{
		Use:     "history <node> [<namespace>/<module> | <module>]",
		Short:   "The transition log of the node's pairs, oldest first",
		Example: "  kubectl kmm history node-1\n  kubectl kmm history node-1 drivers/nic -o yaml",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return errors.New("history needs a node and takes at most one module: kubectl kmm history <node> [<namespace>/<module>]")
			}
			return nil
		},
		ValidArgsFunction: root.completeHistory,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args)
		},
	}
	// "wide" prints the table, as it did before -o took kubectl's formats.
	addPrintFlags(cmd, o.print, outputWide)
	return cmd
}

func (o *historyOptions) run(ctx context.Context, args []string) error {
	printer, err := printerFor(o.print, outputWide)
	if err != nil {
		return err
	}
	s, err := o.connect()
	if err != nil {
		return err
	}
	var filter moduleFilter
	if len(args) == 2 {
		if filter, err = moduleArg(args[1], s.namespace); err != nil {
			return err
		}
	}
	nmc, err := s.nmc(ctx, args[0])
	if err != nil {
		return err
	}
	rows := historyRows(nmc, filter)
	out := o.streams.Out
	if printer != nil {
		return printRows(printer, o.print, out, rows, func(r HistoryRow) string { return r.Node })
	}
	text := renderHistory(rows, o.tableWidth())
	if len(rows) == 0 {
		text = fmt.Sprintf("No transitions recorded on node %s.\n", args[0])
	}
	_, err = io.WriteString(out, text)
	return err
}
