package fsm

import (
	"testing"
	"time"
)

func TestDecideOrphans(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		in   OrphanFacts
		want OrphanDecision
	}{
		{name: "no entry: nothing to do", in: OrphanFacts{Since: t0, Now: t0.Add(time.Hour)}},
		{name: "first seen now: wait the whole default grace", in: OrphanFacts{Nodes: []string{"n0"}, Now: t0},
			want: OrphanDecision{RequeueAfter: DefaultOrphanGrace}},
		{name: "within the grace: wait what is left", in: OrphanFacts{Nodes: []string{"n0"}, Since: t0, Now: t0.Add(time.Second), Grace: 3 * time.Second},
			want: OrphanDecision{RequeueAfter: 2 * time.Second}},
		{name: "the grace is over: remove", in: OrphanFacts{Nodes: []string{"n0", "n1"}, Since: t0, Now: t0.Add(3 * time.Second), Grace: 3 * time.Second},
			want: OrphanDecision{Remove: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := DecideOrphans(c.in); got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}
