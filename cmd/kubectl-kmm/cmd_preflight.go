package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/preflight"
)

// preflightOptions are the flags of `kubectl kmm preflight`.
type preflightOptions struct {
	*rootOptions
	print    *genericclioptions.PrintFlags
	fromNode string
}

func newPreflightCommand(root *rootOptions) *cobra.Command {
	o := &preflightOptions{rootOptions: root, print: genericclioptions.NewPrintFlags("")}
	cmd := &cobra.Command{
		Use:   "preflight (<kernel> | --from-node <node>)",
		Short: "Is every Module served on a kernel? (a PreflightValidation, without creating one)",
		Long: "preflight checks every Module against a kernel the nodes do not run yet, as a PreflightValidation\n" +
			"does: a kernel mapping must match it and the image it names must exist (one manifest HEAD, with\n" +
			"the Module's pull secret and registryTLS). --from-node takes the kernel of a node that already\n" +
			"runs it (a canary). It needs list on Modules and Nodes and get on the Modules' pull secrets.",
		Example: "  kubectl kmm preflight 5.14.0-570.el9.x86_64\n  kubectl kmm preflight --from-node canary-1 -o json",
		Args: func(_ *cobra.Command, args []string) error {
			if (len(args) == 1) == (o.fromNode != "") || len(args) > 1 {
				return errors.New("preflight needs a kernel or --from-node <node>, not both: kubectl kmm preflight <kernel>")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), args)
		},
	}
	cmd.Flags().StringVar(&o.fromNode, "from-node", "", "Check against the kernel this node runs (node.status.nodeInfo.kernelVersion).")
	addPrintFlags(cmd, o.print)
	return cmd
}

func (o *preflightOptions) run(ctx context.Context, args []string) error {
	printer, err := printerFor(o.print)
	if err != nil {
		return err
	}
	if *o.print.OutputFormat == "name" {
		return errors.New("-o name: preflight creates no object; use -o json")
	}
	s, err := o.connect()
	if err != nil {
		return err
	}
	kernel, err := o.kernel(ctx, s.client, args)
	if err != nil {
		return err
	}
	verdicts, err := preflight.Run(ctx, s.client, preflight.Options{Kernel: kernel})
	if err != nil {
		return explain(err, "checking the Modules")
	}
	out := o.streams.Out
	if printer != nil {
		if verdicts == nil {
			verdicts = []preflight.Verdict{}
		}
		return printer.PrintObj(&printable{v: rowList[preflight.Verdict]{APIVersion: "v1", Kind: "List", Items: verdicts}}, out)
	}
	if err := preflight.WriteTable(out, kernel, verdicts); err != nil {
		return err
	}
	_, err = io.WriteString(out, preflight.Summary(kernel, verdicts)+"\n")
	return err
}

// kernel is the kernel argument, or the kernel --from-node's node runs.
func (o *preflightOptions) kernel(ctx context.Context, c client.Client, args []string) (string, error) {
	if o.fromNode == "" {
		return args[0], nil
	}
	n := &corev1.Node{}
	err := c.Get(ctx, client.ObjectKey{Name: o.fromNode}, n)
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("node %s not found", o.fromNode)
	}
	if err != nil {
		return "", explain(err, "reading node "+o.fromNode)
	}
	if n.Status.NodeInfo.KernelVersion == "" {
		return "", fmt.Errorf("node %s reports no kernel version (status.nodeInfo.kernelVersion)", o.fromNode)
	}
	return n.Status.NodeInfo.KernelVersion, nil
}
