package main

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestPairChanges(t *testing.T) {
	t1, t2 := t0, t0.Add(time.Minute)
	row := func(node, module, state, reason string, since time.Time) PairRow {
		return PairRow{Node: node, Module: module, State: state, Reason: reason, Since: &since}
	}
	loading := row("n1", "d/nic", "Loading", "SpecSet", t1)
	loaded := row("n1", "d/nic", "Loaded", "WorkerSucceeded", t2)
	other := row("n1", "d/gpu", "Loaded", "WorkerSucceeded", t1)
	steps := []struct {
		name string
		node string
		rows []PairRow
		want []PairRow
	}{
		{"same rows: nothing", "n1", []PairRow{loading, other}, nil},
		{"age changes alone: nothing", "n1", []PairRow{withAge(loading, "5s"), other}, nil},
		{"state changes", "n1", []PairRow{loaded, other}, []PairRow{loaded}},
		{"reason changes", "n1", []PairRow{withReason(loaded, "Adopted"), other}, []PairRow{withReason(loaded, "Adopted")}},
		{"same state and reason, new transition", "n1", []PairRow{withReason(withSince(loaded, t2.Add(time.Second)), "Adopted"), other},
			[]PairRow{withReason(withSince(loaded, t2.Add(time.Second)), "Adopted")}},
		{"new node", "n2", []PairRow{row("n2", "d/nic", "Absent", "Pending", time.Time{})}, []PairRow{row("n2", "d/nic", "Absent", "Pending", time.Time{})}},
		{"entry gone", "n1", []PairRow{withReason(withSince(loaded, t2.Add(time.Second)), "Adopted")}, []PairRow{removed(other)}},
		{"NMC gone", "n2", nil, []PairRow{removed(row("n2", "d/nic", "Absent", "Pending", time.Time{}))}},
		{"NMC still gone: nothing", "n2", nil, nil},
	}
	c := newPairChanges([]PairRow{loading, other})
	for _, s := range steps {
		if got := c.update(s.node, s.rows); !reflect.DeepEqual(got, s.want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", s.name, got, s.want)
		}
	}
	if _, ok := c["n2"]; ok || len(c) != 1 {
		t.Errorf("a gone node is still remembered: %+v", c)
	}
}

func withAge(r PairRow, age string) PairRow       { r.Age = age; return r }
func withReason(r PairRow, reason string) PairRow { r.Reason = reason; return r }
func withSince(r PairRow, since time.Time) PairRow {
	r.Since = &since
	return r
}

func TestWatchLineLinesUp(t *testing.T) {
	rows := []PairRow{{Node: "node-1", Module: "drivers/nic", State: "Loaded", Age: "5m", Reason: "WorkerSucceeded"}}
	var b strings.Builder
	_ = watchTable(rows, 100, false).write(&b)
	table := b.String()
	for _, s := range watchStates {
		line := watchLine(rows, PairRow{Node: "node-1", Module: "drivers/nic", State: string(s), Age: "23h59m", Reason: "SpecRemoved"}, 100, false, false)
		if idx(table, "STATE") != idx(line, string(s)) || idx(table, "REASON") != idx(line, "SpecRemoved") {
			t.Errorf("the watch line does not line up with the table:\n%s%s", table, line)
		}
	}
	if line := watchLine(nil, rows[0], 100, false, true); !strings.HasPrefix(line, "NODE ") || strings.Count(line, "\n") != 2 {
		t.Errorf("the first change after an empty table comes without a header:\n%s", line)
	}
}

func idx(s, sub string) int {
	for i := range len(s) - len(sub) + 1 {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestRelistPauseResetsAfterAHealthyWatch: pauses grow while watches expire at once, and fall back
// to the first after a watch that ran longer than the longest pause (the seeded fault, a back-off
// never reset, keeps 30 s pauses for the rest of the session).
func TestRelistPauseResetsAfterAHealthyWatch(t *testing.T) {
	b := relistBackOff
	var grown time.Duration
	for range 8 {
		grown = relistPause(&b, time.Millisecond)
	}
	if grown < 20*time.Second {
		t.Fatalf("after 8 expiries in a row the pause is %v, want it grown towards %v", grown, relistBackOff.Cap)
	}
	first := relistPause(&b, relistBackOff.Cap+time.Second)
	if first > 2*relistBackOff.Duration {
		t.Fatalf("after a watch that ran %v the pause is %v, want about %v", relistBackOff.Cap+time.Second, first, relistBackOff.Duration)
	}
}
