package fsm

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecideHandover(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		in      HandoverFacts
		del     bool
		waiting []string
		stuck   bool
		msg     string
	}{
		{name: "kmm's pods Ready wherever upstream's run: delete upstream's",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n1", "n0"}, KMMReady: map[string]bool{"n0": true, "n1": true}}, del: true},
		{name: "one node still without a Ready kmm pod: wait for it",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n2", "n0", "n1", "n2"}, KMMReady: map[string]bool{"n0": true}}, waiting: []string{"n1", "n2"}},
		{name: "no upstream pod scheduled anywhere: delete",
			in: HandoverFacts{KMMRuns: true}, del: true},
		{name: "kmm runs no device plugin (Module deleted): delete at once, before the unload",
			in: HandoverFacts{UpstreamNodes: []string{"n0"}}, del: true},
		{name: "kmm runs no device plugin, past the timeout: still delete at once",
			in: HandoverFacts{UpstreamNodes: []string{"n0"}, Since: t0, Now: t0.Add(time.Hour)}, del: true},
		{name: "kmm's pods Ready everywhere past the timeout: delete, not stuck",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n0"}, KMMReady: map[string]bool{"n0": true}, Since: t0, Now: t0.Add(time.Hour)}, del: true},
		{name: "waiting within the timeout: not stuck",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n0"}, Since: t0, Now: t0.Add(DefaultHandoverTimeout - time.Second)}, waiting: []string{"n0"}},
		{name: "waiting past the default timeout: stuck, upstream's kept",
			in:      HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n0", "n1"}, KMMPods: map[string]bool{"n1": true}, Since: t0, Now: t0.Add(DefaultHandoverTimeout)},
			waiting: []string{"n0", "n1"}, stuck: true, msg: "n0 (no pod), n1 (pod not Ready)"},
		{name: "a shorter timeout",
			in:      HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n0"}, Since: t0, Now: t0.Add(2 * time.Second), Timeout: time.Second},
			waiting: []string{"n0"}, stuck: true},
		{name: "no start known: never stuck",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n0"}, Now: t0}, waiting: []string{"n0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := DecideHandover(c.in)
			if got.DeleteUpstream != c.del || !slices.Equal(got.Waiting, c.waiting) || got.Stuck != c.stuck || !strings.Contains(got.Message, c.msg) {
				t.Errorf("got %+v, want delete %v waiting %v stuck %v message with %q", got, c.del, c.waiting, c.stuck, c.msg)
			}
			if (len(c.waiting) > 0) != (got.Message != "") {
				t.Errorf("message %q for waiting %v", got.Message, got.Waiting)
			}
		})
	}
}
