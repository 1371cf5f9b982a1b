package image

import (
	"flag"
	"fmt"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// The explorer walks every sequence of events up to a depth, for each recipe, from a fresh image,
// checking the properties after every event and convergence at every leaf: where rapid samples,
// it is exhaustive, and the first violation it meets is a shortest one.

var exploreDepth = flag.Int("image.depth", 5, "depth of the image machine's exhaustive exploration")

// exploration is what a walk found: the edges taken, the sequences run, and a counterexample.
type exploration struct {
	edges   map[string]int
	seen    map[string]int // canonical world -> the most depth left it was walked with
	leaves  int
	failure string
}

func explore(m *Machine, gate func(*kmmv1beta1.ModuleImageState) bool, depth int) exploration {
	x := exploration{edges: map[string]int{}, seen: map[string]int{}}
	for _, r := range recipes {
		w := newWorld(m, gate, r)
		if broken := w.reconcile(); broken != "" {
			x.failure = broken + "\n" + w.String()
			return x
		}
		if x.walk(w, depth); x.failure != "" {
			return x
		}
	}
	return x
}

// walk tries every event from w, depth deep (breadth of the alphabet at each level).
func (x *exploration) walk(w *world, depth int) {
	x.count(w)
	k := w.key()
	if d, ok := x.seen[k]; ok && d >= depth {
		return // walked from here already, at least as deep
	}
	x.seen[k] = depth
	if depth == 0 {
		x.leaves++
		c := w.clone()
		if broken := c.converge(); broken != "" {
			x.failure = broken + "\n" + c.String()
		}
		return
	}
	for e := range numEvents {
		next := w.clone()
		if broken := next.apply(e); broken != "" {
			x.failure = broken + "\n" + next.String()
			return
		}
		if x.walk(next, depth-1); x.failure != "" {
			return
		}
	}
}

// count records the transitions of w's entry log (a transition is counted once per path prefix
// that ends with it, which is enough to see whether it was taken).
func (x *exploration) count(w *world) {
	if n := len(w.entry.Transitions); n > 0 {
		tr := w.entry.Transitions[n-1]
		x.edges[fmt.Sprintf("%s --%s--> %s", tr.From, tr.Trigger, tr.To)]++
	}
}

// TestExplore: every sequence of up to -image.depth events (default 5; 12 kinds of event, each
// world walked once per depth) keeps the properties and converges, and the walk takes every edge
// of the machine.
func TestExplore(t *testing.T) {
	x := explore(Default(), MayLoad, *exploreDepth)
	if x.failure != "" {
		t.Fatal(x.failure)
	}
	var missed []string
	for _, e := range Edges() {
		if k := fmt.Sprintf("%s --%s--> %s", e.From, e.Trigger, e.To); x.edges[k] == 0 {
			missed = append(missed, k)
		}
	}
	t.Logf("%d distinct worlds, %d leaves at depth %d; %d of %d edges taken", len(x.seen), x.leaves, *exploreDepth, len(Edges())-len(missed), len(Edges()))
	if len(missed) > 0 {
		t.Errorf("edges never taken: %v", missed)
	}
}

// TestExploreCatchesSeededFaults: the explorer finds each seeded fault too, at a smaller depth,
// and shows its shortest counterexample.
func TestExploreCatchesSeededFaults(t *testing.T) {
	for _, tc := range seededFaults {
		t.Run(tc.name, func(t *testing.T) {
			m, gate := Default(), MayLoad
			if tc.edges != nil {
				m = NewMachine(tc.edges)
			}
			if tc.gate != nil {
				gate = tc.gate
			}
			x := explore(m, gate, 4)
			if x.failure == "" {
				t.Fatalf("no counterexample for the fault %q within depth 4", tc.name)
			}
			t.Logf("shortest counterexample:\n%s", x.failure)
		})
	}
}
