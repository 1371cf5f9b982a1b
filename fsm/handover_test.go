package fsm

import (
	"slices"
	"testing"
)

func TestDecideHandover(t *testing.T) {
	cases := []struct {
		name    string
		in      HandoverFacts
		del     bool
		waiting []string
	}{
		{name: "kmm's pods Ready wherever upstream's run: delete upstream's",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n1", "n0"}, KMMReady: map[string]bool{"n0": true, "n1": true}}, del: true},
		{name: "one node still without a Ready kmm pod: wait for it",
			in: HandoverFacts{KMMRuns: true, UpstreamNodes: []string{"n2", "n0", "n1", "n2"}, KMMReady: map[string]bool{"n0": true}}, waiting: []string{"n1", "n2"}},
		{name: "no upstream pod scheduled anywhere: delete",
			in: HandoverFacts{KMMRuns: true}, del: true},
		{name: "kmm runs no device plugin (Module deleted): delete at once, before the unload",
			in: HandoverFacts{UpstreamNodes: []string{"n0"}}, del: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := DecideHandover(c.in)
			if got.DeleteUpstream != c.del || !slices.Equal(got.Waiting, c.waiting) {
				t.Errorf("got %+v, want delete %v waiting %v", got, c.del, c.waiting)
			}
		})
	}
}
