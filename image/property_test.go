package image

import (
	"context"
	"flag"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/rapidtb"
)

// runModel is one rapid check: a recipe, a random sequence of events, the properties after each,
// convergence at the end.
func runModel(m *Machine, gate func(*kmmv1beta1.ModuleImageState) bool) func(*rapid.T) {
	return func(t *rapid.T) {
		w := newWorld(m, gate, rapid.SampledFrom(recipes).Draw(t, "recipe"))
		if broken := w.reconcile(); broken != "" {
			t.Fatalf("%s\n%s", broken, w)
		}
		for _, e := range rapid.SliceOfN(rapid.IntRange(0, int(numEvents)-1), 0, 40).Draw(t, "events") {
			if broken := w.apply(event(e)); broken != "" {
				t.Fatalf("%s\n%s", broken, w)
			}
		}
		if broken := w.converge(); broken != "" {
			t.Fatalf("%s\n%s", broken, w)
		}
	}
}

// TestProperties: random event sequences over the four recipes keep the five properties and
// converge. `make test` runs it with RAPID_CHECKS=10000.
func TestProperties(t *testing.T) {
	rapid.Check(t, runModel(Default(), MayLoad))
}

// replaceEdges returns Edges with every edge from `from` on trigger t replaced by with.
func replaceEdges(from State, t Trigger, with ...Edge) []Edge {
	out := slices.DeleteFunc(Edges(), func(e Edge) bool { return e.From == from && e.Trigger == t })
	return append(out, with...)
}

func noBuildWanted(ctx context.Context, args ...any) bool { return !buildWanted(ctx, args...) }

// seededFaults are machines with one deliberate mistake each, and the property that must catch it.
var seededFaults = []struct {
	name     string
	edges    []Edge
	gate     func(*kmmv1beta1.ModuleImageState) bool
	property string
}{
	{"a rebuild trigger abandons the running build (a second build starts beside it)",
		append(Edges(), Edge{Building, RebuildRequested, Checking, nil}), nil, "property 1"},
	{"an image found is built anyway when the recipe builds",
		replaceEdges(Checking, ImageFound, Edge{Checking, ImageFound, Building, buildWanted}, Edge{Checking, ImageFound, Present, noBuildWanted}), nil, "property 2"},
	{"a finished build is taken for the image (no sign, no check)",
		replaceEdges(Building, BuildSucceeded, Edge{Building, BuildSucceeded, Present, nil}), nil, "property 3"},
	{"the gate opens while the image is signed",
		nil, func(st *kmmv1beta1.ModuleImageState) bool { return MayLoad(st) || (st != nil && st.State == Signing) }, "property 3"},
	{"a failed sign checks the image again (upstream's rebuild loop)",
		replaceEdges(SignBackOff, BackOffExpired, Edge{SignBackOff, BackOffExpired, Checking, nil}), nil, "property 4"},
	{"a failed build is retried without checking the image",
		replaceEdges(BuildBackOff, BackOffExpired, Edge{BuildBackOff, BackOffExpired, Building, nil}), nil, "property 5"},
}

// TestSeededFaultsAreCaught runs the property test against each faulty machine and requires rapid
// to find a counterexample that names the property the fault breaks.
func TestSeededFaultsAreCaught(t *testing.T) {
	rapidtb.SetFlag(t, "rapid.nofailfile", "true")
	if checks, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String()); checks < 2000 {
		rapidtb.SetFlag(t, "rapid.checks", "2000")
	}
	for _, tc := range seededFaults {
		t.Run(tc.name, func(t *testing.T) {
			m, gate := Default(), MayLoad
			if tc.edges != nil {
				m = NewMachine(tc.edges)
			}
			if tc.gate != nil {
				gate = tc.gate
			}
			rec := rapidtb.New(t)
			rapid.Check(rec, runModel(m, gate))
			if !rec.Failed() {
				t.Fatalf("rapid found no counterexample for the fault %q", tc.name)
			}
			if msg := rec.Messages(); !strings.Contains(msg, tc.property) {
				t.Fatalf("the fault %q was caught, but not by %s:\n%s", tc.name, tc.property, msg)
			}
			t.Logf("caught by %s", tc.property)
		})
	}
}
