package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kmm-project/kmm/fsm"
)

// defaultWidth is the terminal width assumed when neither --width nor $COLUMNS says otherwise.
const defaultWidth = 100

const usageText = `kubectl kmm shows what the kmm operator is doing with each (node, module) pair.

Usage:
  kubectl kmm status [<namespace>/<module> | <module>] [flags]
      One row per (node, module) pair: state, time in it, attempts and reason, below a summary of
      each Module. Without a module it shows every Module (of one namespace with -n).
  kubectl kmm history <node> [<namespace>/<module> | <module>] [flags]
      The transition log of the node's pairs, oldest first.
  kubectl kmm diagram [--format mermaid|dot]
      The state machine the operator runs, as a Mermaid (default) or Graphviz DOT diagram.

Flags (anywhere on the command line):
  --kubeconfig <file>           kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config)
  --context <name>              kubeconfig context to use
  -n, --namespace <namespace>   namespace of a module given by name; without a module, status shows
                                only this namespace's Modules (default: all namespaces)
  -o, --output json|wide        json: a stable list of objects for scripts (status, history);
                                wide: status with kernel and image columns, nothing truncated
  --format mermaid|dot          format of diagram (default mermaid)
  --width <columns>             terminal width the tables fit (default: $COLUMNS, else 100)
  --request-timeout <duration>  timeout of each API request (default 30s)
  -h, --help                    this help
`

// options is the parsed command line.
type options struct {
	kubeconfig, context, namespace string
	output, format                 string
	width                          int
	requestTimeout                 time.Duration
	// args are the command and its arguments (flags may come before, between or after them).
	args []string
}

// run is the whole command: it parses args, talks to the cluster and prints to stdout; usage and
// flag errors go to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(o.args) == 0 {
		_, _ = io.WriteString(stderr, usageText)
		return errors.New("missing command: status, history or diagram")
	}
	switch o.args[0] {
	case "status":
		return runStatus(ctx, o, stdout)
	case "history":
		return runHistory(ctx, o, stdout)
	case "diagram":
		return runDiagram(o, stdout)
	case "help":
		_, err := io.WriteString(stdout, usageText)
		return err
	}
	return fmt.Errorf("unknown command %q: want status, history or diagram (kubectl kmm --help)", o.args[0])
}

// parseArgs reads flags anywhere on the command line, as kubectl does.
func parseArgs(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("kubectl kmm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { _, _ = io.WriteString(stderr, usageText) }
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
	fs.StringVar(&o.context, "context", "", "The kubeconfig context to use.")
	fs.StringVar(&o.namespace, "namespace", "", "Namespace of the module argument; with no module argument, show only this namespace's Modules.")
	fs.StringVar(&o.namespace, "n", "", "Short for --namespace.")
	fs.StringVar(&o.output, "output", "", "Output format of status and history: json, or wide (status: kernel and image, nothing truncated).")
	fs.StringVar(&o.output, "o", "", "Short for --output.")
	fs.StringVar(&o.format, "format", "mermaid", "Format of diagram: mermaid or dot.")
	fs.IntVar(&o.width, "width", 0, "Terminal width the tables fit (default: $COLUMNS, else 100).")
	fs.DurationVar(&o.requestTimeout, "request-timeout", 30*time.Second, "Timeout of each API request.")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	o.args = positional
	switch o.output {
	case "", "json", "wide":
	default:
		return nil, fmt.Errorf("unknown output format %q: want json or wide", o.output)
	}
	return o, nil
}

// parseInterspersed parses flags that may follow positional arguments; everything after "--" is
// positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// tableWidth is the width tables must fit: --width, else $COLUMNS, else defaultWidth.
func (o *options) tableWidth() int {
	if o.width > 0 {
		return o.width
	}
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		return c
	}
	return defaultWidth
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

func runStatus(ctx context.Context, o *options, out io.Writer) error {
	if len(o.args) > 2 {
		return errors.New("status takes at most one module: kubectl kmm status [<namespace>/<module>]")
	}
	s, err := connect(o)
	if err != nil {
		return err
	}
	filter := moduleFilter{namespace: o.namespace}
	if len(o.args) == 2 {
		if filter, err = moduleArg(o.args[1], s.namespace); err != nil {
			return err
		}
	}
	view, err := s.statusView(ctx, filter)
	if err != nil {
		return err
	}
	if o.output == "json" {
		return writeJSON(out, view.rows)
	}
	wide := o.output == "wide"
	text := renderStatus(view.summaries, view.rows, o.tableWidth(), wide)
	if len(view.rows) == 0 {
		text = renderSummaries(view.summaries, o.tableWidth(), wide) + noPairsMessage(filter)
		if view.noNMC && filter.name == "" {
			text = renderSummaries(view.summaries, o.tableWidth(), wide) + noNMCMessage
		}
	}
	_, err = io.WriteString(out, text)
	return err
}

// noPairsMessage explains an empty status table.
func noPairsMessage(f moduleFilter) string {
	if f.name != "" {
		return fmt.Sprintf("No node has an entry for %s/%s: its selector matches no node, or no kernel mapping "+
			"matches the kernels of the nodes it selects (see Degraded above).\n", f.namespace, f.name)
	}
	return "No (node, module) pairs.\n"
}

func runHistory(ctx context.Context, o *options, out io.Writer) error {
	if len(o.args) < 2 || len(o.args) > 3 {
		return errors.New("history needs a node and takes at most one module: kubectl kmm history <node> [<namespace>/<module>]")
	}
	s, err := connect(o)
	if err != nil {
		return err
	}
	var filter moduleFilter
	if len(o.args) == 3 {
		if filter, err = moduleArg(o.args[2], s.namespace); err != nil {
			return err
		}
	}
	nmc, err := s.nmc(ctx, o.args[1])
	if err != nil {
		return err
	}
	rows := historyRows(nmc, filter)
	if o.output == "json" {
		return writeJSON(out, rows)
	}
	text := renderHistory(rows, o.tableWidth())
	if len(rows) == 0 {
		text = fmt.Sprintf("No transitions recorded on node %s.\n", o.args[1])
	}
	_, err = io.WriteString(out, text)
	return err
}

func runDiagram(o *options, out io.Writer) error {
	if len(o.args) > 1 {
		return errors.New("diagram takes no arguments: kubectl kmm diagram [--format mermaid|dot]")
	}
	var text string
	switch o.format {
	case "mermaid":
		text = fsm.Mermaid()
	case "dot":
		text = fsm.DOT()
	default:
		return fmt.Errorf("unknown diagram format %q: want mermaid or dot", o.format)
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	_, err := io.WriteString(out, text)
	return err
}

// writeJSON prints v as indented JSON; an empty list prints as [].
func writeJSON[T any](out io.Writer, rows []T) error {
	if rows == nil {
		rows = []T{}
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(rows)
}
