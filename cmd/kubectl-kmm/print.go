package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// outputWide is the -o value of status's wide table; "" is the default table.
const outputWide = "wide"

// addPrintFlags adds -o (and --template, ...) as kubectl has them, plus the table formats the
// command prints itself.
func addPrintFlags(cmd *cobra.Command, f *genericclioptions.PrintFlags, tables ...string) {
	f.AddFlags(cmd)
	formats := append(append([]string{}, tables...), f.AllowedFormats()...)
	cmd.Flags().Lookup("output").Usage = "Output format. One of: (" + strings.Join(formats, ", ") +
		"). Without -o: a table. json and yaml print a List whose items are the rows, each with the fields " +
		"documented in docs/troubleshooting.md; jsonpath and go-template see that List; name prints the " +
		"NodeModulesConfigs the rows come from."
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return formats, cobra.ShellCompDirectiveNoFileComp
	})
}

// printerFor is cli-runtime's printer for -o, or nil when -o names a table the command prints
// itself ("" always; the tables listed).
func printerFor(f *genericclioptions.PrintFlags, tables ...string) (printers.ResourcePrinter, error) {
	format := *f.OutputFormat
	if format == "" && *f.TemplatePrinterFlags.TemplateArgument == "" {
		return nil, nil
	}
	for _, t := range tables {
		if format == t {
			return nil, nil
		}
	}
	p, err := f.ToPrinter()
	if genericclioptions.IsNoCompatiblePrinterError(err) {
		return nil, fmt.Errorf("unknown output format %q: want one of %s", format,
			strings.Join(append(append([]string{}, tables...), f.AllowedFormats()...), ", "))
	}
	return p, err
}

// rowList is what -o json and yaml print: a kubectl List (as `kubectl get -o json` prints one)
// whose items are the rows; jsonpath and go-template run on it ({.items[*].state}).
type rowList[T any] struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Items      []T    `json:"items"`
}

// printable hands a value to cli-runtime's printers, which print runtime.Objects: it marshals as
// the value it holds. Printed values are built for printing and never changed, so a copy may share
// them.
type printable struct{ v any }

func (p *printable) GetObjectKind() schema.ObjectKind {
	// The printers refuse an object without a kind; what they print is v's own JSON.
	return &metav1.TypeMeta{APIVersion: "v1", Kind: "List"}
}

func (p *printable) DeepCopyObject() runtime.Object { c := *p; return &c }

// MarshalJSON marshals the value held.
func (p *printable) MarshalJSON() ([]byte, error) { return json.Marshal(p.v) }

// printRows prints rows as a List with p; with -o name it prints the NodeModulesConfig of each node
// the rows come from, once, in the order of the rows.
func printRows[T any](p printers.ResourcePrinter, f *genericclioptions.PrintFlags, out io.Writer, rows []T, node func(T) string) error {
	if *f.OutputFormat == "name" {
		seen := map[string]bool{}
		for _, r := range rows {
			if n := node(r); !seen[n] {
				seen[n] = true
				if err := p.PrintObj(nmcName(n), out); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if rows == nil {
		rows = []T{}
	}
	return p.PrintObj(&printable{v: rowList[T]{APIVersion: "v1", Kind: "List", Items: rows}}, out)
}

// printRow prints one row as an object (status -w prints each change so); with -o name it prints
// the row's NodeModulesConfig.
func printRow[T any](p printers.ResourcePrinter, f *genericclioptions.PrintFlags, out io.Writer, row T, node string) error {
	if *f.OutputFormat == "name" {
		return p.PrintObj(nmcName(node), out)
	}
	return p.PrintObj(&printable{v: row}, out)
}

// nmcName is a NodeModulesConfig with only its kind and name: what -o name prints.
func nmcName(node string) *kmmv1beta1.NodeModulesConfig {
	return &kmmv1beta1.NodeModulesConfig{
		TypeMeta:   metav1.TypeMeta{APIVersion: kmmv1beta1.GroupVersion.String(), Kind: "NodeModulesConfig"},
		ObjectMeta: metav1.ObjectMeta{Name: node},
	}
}
