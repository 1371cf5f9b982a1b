package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kmm-project/kmm/fsm"
)

func newDiagramCommand(root *rootOptions) *cobra.Command {
	format := "mermaid"
	cmd := &cobra.Command{
		Use:   "diagram [--format mermaid|dot]",
		Short: "The state machine the operator runs, as a Mermaid (default) or Graphviz DOT diagram",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("diagram takes no arguments: kubectl kmm diagram [--format mermaid|dot]")
			}
			return nil
		},
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(*cobra.Command, []string) error {
			return runDiagram(format, root.streams.Out)
		},
	}
	cmd.Flags().StringVar(&format, "format", format, "Format of the diagram: mermaid or dot.")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"mermaid", "dot"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func runDiagram(format string, out io.Writer) error {
	var text string
	switch format {
	case "mermaid":
		text = fsm.Mermaid()
	case "dot":
		text = fsm.DOT()
	default:
		return fmt.Errorf("unknown diagram format %q: want mermaid or dot", format)
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	_, err := io.WriteString(out, text)
	return err
}
