package main

import (
	"sort"
	"strings"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// HistoryRow is one transition of a (node, module) pair; `history -o json` prints a list of them.
// The JSON field names are a stable contract for scripts.
type HistoryRow struct {
	// Time of the transition (the API keeps whole seconds).
	Time time.Time `json:"time"`
	// Node is the node's name.
	Node string `json:"node"`
	// Module is "<namespace>/<name>" of the Module.
	Module    string `json:"module"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// From and To are the states before and after.
	From string `json:"from"`
	To   string `json:"to"`
	// Trigger is what caused the transition, Reason its short explanation.
	Trigger string `json:"trigger"`
	Reason  string `json:"reason"`
}

// historyRows lists the transition logs of the node's pairs that filter selects, oldest first; within
// one second, transitions stay in the order of each pair's log, pairs ordered by module.
func historyRows(nmc *kmmv1beta1.NodeModulesConfig, filter moduleFilter) []HistoryRow {
	var rows []HistoryRow
	for _, st := range nmc.Status.Modules {
		if !filter.matches(st.Namespace, st.Name) {
			continue
		}
		for _, t := range st.Transitions {
			rows = append(rows, HistoryRow{
				Time: t.Time.UTC(), Node: nmc.Name, Module: st.Namespace + "/" + st.Name, Namespace: st.Namespace, Name: st.Name,
				From: string(t.From), To: string(t.To), Trigger: t.Trigger, Reason: t.Reason,
			})
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if !rows[i].Time.Equal(rows[j].Time) {
			return rows[i].Time.Before(rows[j].Time)
		}
		return rows[i].Module < rows[j].Module
	})
	return rows
}

// historyTimeFormat prints transition times in UTC to the second, as the API stores them.
const historyTimeFormat = "2006-01-02T15:04:05Z"

// renderHistory prints the transition table, fitting width columns (0: no limit).
func renderHistory(rows []HistoryRow, width int) string {
	t := &table{headers: []string{"TIME", "MODULE", "FROM → TO", "TRIGGER", "REASON"},
		caps: []int{0, moduleCap}, width: width, minLast: minReason}
	for _, r := range rows {
		t.add(r.Time.Format(historyTimeFormat), r.Module, r.From+" → "+r.To, r.Trigger, dash(r.Reason))
	}
	var b strings.Builder
	_ = t.write(&b) // a strings.Builder does not fail
	return b.String()
}
