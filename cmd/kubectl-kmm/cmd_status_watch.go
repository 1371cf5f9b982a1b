package main

import (
	"context"
	"io"
	"strings"

	"k8s.io/cli-runtime/pkg/printers"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// follow is status -w: what status prints, then a row (or, with -o, an object) each time a pair's
// state or reason changes, until ctx ends (Ctrl-C).
func (o *statusOptions) follow(ctx context.Context, s *session, filter moduleFilter, view *statusView, printer printers.ResourcePrinter) error {
	out := o.streams.Out
	emit := o.rowEmitter(out, view, printer)
	if printer == nil {
		if _, err := io.WriteString(out, o.watchText(view, filter)); err != nil {
			return err
		}
	} else {
		for _, r := range view.rows {
			if err := emit(r); err != nil {
				return err
			}
		}
	}
	pairs := newPairChanges(view.rows)
	observe := func(name string, nmc *kmmv1beta1.NodeModulesConfig) error {
		var rows []PairRow
		if nmc != nil {
			rows = nodeRows(nmc, filter, s.now())
		}
		for _, r := range pairs.update(name, rows) {
			if err := emit(r); err != nil {
				return err
			}
		}
		return nil
	}
	relist := func(nmcs []kmmv1beta1.NodeModulesConfig) error {
		seen := map[string]bool{}
		for i := range nmcs {
			seen[nmcs[i].Name] = true
			if err := observe(nmcs[i].Name, &nmcs[i]); err != nil {
				return err
			}
		}
		for node := range pairs {
			if !seen[node] {
				if err := observe(node, nil); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return s.watchNMCs(ctx, o.watchHooks, view.resourceVersion, observe, relist)
}

// rowEmitter prints one changed row: with a printer as an object, else as a line of the status
// table printed first (the header first if that printed none).
func (o *statusOptions) rowEmitter(out io.Writer, view *statusView, printer printers.ResourcePrinter) func(PairRow) error {
	if printer != nil {
		return func(r PairRow) error { return printRow(printer, o.print, out, r, r.Node) }
	}
	wide := *o.print.OutputFormat == outputWide
	header := len(view.rows) == 0
	return func(r PairRow) error {
		_, err := io.WriteString(out, watchLine(view.rows, r, o.tableWidth(), wide, header))
		header = false
		return err
	}
}

// watchText is what status prints, with the table's columns as wide as later rows need.
func (o *statusOptions) watchText(view *statusView, filter moduleFilter) string {
	if len(view.rows) == 0 {
		return o.statusText(view, filter)
	}
	wide := *o.print.OutputFormat == outputWide
	var b strings.Builder
	b.WriteString(renderSummaries(view.summaries, o.tableWidth(), wide))
	if len(view.summaries) > 0 {
		b.WriteString("\n")
	}
	_ = watchTable(view.rows, o.tableWidth(), wide).write(&b) // a strings.Builder does not fail
	return b.String()
}

// watchStates are the states a pair may take: status -w's STATE column fits each of them.
var watchStates = []kmmv1beta1.ModuleState{kmmv1beta1.StateAbsent, kmmv1beta1.StateLoading, kmmv1beta1.StateLoaded,
	kmmv1beta1.StateUnloading, kmmv1beta1.StateDevicePluginDraining, kmmv1beta1.StateUpgrading,
	kmmv1beta1.StateLoadBackOff, kmmv1beta1.StateUnloadBackOff}

// watchAgeWidth fits ages up to "23h59m" and "59m59s".
const watchAgeWidth = 6

// watchTable is the status table with its STATE and AGE columns wide enough for any later row.
func watchTable(rows []PairRow, width int, wide bool) *table {
	t := statusTable(rows, width, wide)
	stateWidth := 0
	for _, s := range watchStates {
		stateWidth = max(stateWidth, runeLen(string(s)))
	}
	t.mins = []int{0, 0, stateWidth, watchAgeWidth}
	return t
}

// watchLine renders row as a line of the table watchTable makes of rows, so that it lines up
// under it; a column widens only for a node or module name longer than the table's.
func watchLine(rows []PairRow, row PairRow, width int, wide, header bool) string {
	t := watchTable(append(rows[:len(rows):len(rows)], row), width, wide)
	widths := t.columnWidths()
	var b strings.Builder
	if header {
		t.writeRow(&b, t.headers, widths)
	}
	t.writeRow(&b, t.rows[len(t.rows)-1], widths)
	return b.String()
}
