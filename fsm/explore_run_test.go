package fsm

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kmm-project/kmm/test/rapidtb"
)

var (
	exploreDepth    = flag.Int("explore.depth", 0, "depth of TestExplore (0: each configuration's default)")
	exploreReport   = flag.String("explore.report", "", "write the exploration report (bounds, coverage, shortest counterexamples) to this file")
	exploreUpstream = flag.Bool("explore.upstream", false, "also start from records upstream KMM left (see openFindings)")
)

// openFindings are violations the explorer finds that are not fixed yet, with the starting world
// that shows them, kept out of the default exploration until they are (`-explore.upstream` puts it
// back). Each is in docs/evidence.md.
var openFindings = map[string]string{
	rootFromUpstream.name: "a record upstream KMM left for a Module that kmm's spec no longer has (the Module deleted, " +
		"or the node not selected) is dropped as Absent while the module stays in the kernel: nothing unloads it " +
		"(invariant 7; one step: DeleteModule, then events stop)",
}

// transitionsOnlyFrom are transitions only an open finding's starting world reaches.
var transitionsOnlyFrom = map[Edge]string{
	{From: Absent, Trigger: Adopted, To: Loaded}: rootFromUpstream.name,
}

// reportRapidChecks and reportRapidSeed make the rapid sample of the report repeatable.
const (
	reportRapidChecks = 1000
	reportRapidSeed   = "1"
)

// TestExplore explores every configuration to its depth, fails on any violation, and requires the
// exploration to take every transition of the machine. It prints the state counts (`make explore`
// shows them; `go test ./...` shows only failures).
func TestExplore(t *testing.T) {
	var results []exploreResult
	reached := map[Edge]int{}
	for i := range exploreSpecs {
		spec := &exploreSpecs[i]
		depth := spec.depth
		if *exploreDepth > 0 {
			depth = *exploreDepth
		}
		if *exploreUpstream && i == 0 {
			cp := *spec
			cp.roots = append(slices.Clone(spec.roots), rootFromUpstream)
			spec = &cp
		}
		cpu0 := cpuTime()
		r := newExplorer(spec, faults{}).explore(depth)
		line := fmt.Sprintf("explore: %s: %d states to depth %d (new states per level %v), %d actions run, %.1f s (%.1f s CPU)",
			r.cfg, r.states, r.depth, r.perLevel, r.runs, r.elapsed.Seconds(), (cpuTime() - cpu0).Seconds())
		fmt.Println(line)
		if r.violation != nil {
			t.Errorf("violation:\n%s", r.trace)
		}
		for e, level := range r.edges {
			if old, ok := reached[e]; !ok || level < old {
				reached[e] = level
			}
			if !permittedEdges()[e] {
				t.Errorf("the exploration took %s, which is not a transition of the machine", e)
			}
		}
		results = append(results, r)
	}
	var never []string
	for _, e := range sortedEdges(permittedEdges()) {
		if _, ok := reached[e]; !ok {
			never = append(never, e.String())
		}
	}
	line := fmt.Sprintf("explore: %d of the machine's %d transitions taken; never taken: %v", len(permittedEdges())-len(never), len(permittedEdges()), never)
	fmt.Println(line)
	if *exploreReport != "" {
		writeReport(t, results, reached)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// shortestCounterexample explores every configuration with the fault until the first violation,
// and returns the shortest one found (nil when none is within the default depths).
func shortestCounterexample(f faults) *exploreResult {
	var best *exploreResult
	for i := range exploreSpecs {
		spec := &exploreSpecs[i]
		depth := spec.depth
		if best != nil {
			depth = len(best.violation.steps) - 1 // only a shorter one would do
		}
		if depth < 0 {
			break
		}
		r := newExplorer(spec, f).explore(depth)
		if r.violation != nil && (best == nil || len(r.violation.steps) < len(best.violation.steps)) {
			best = &r
		}
	}
	return best
}

// TestExploreFindsSeededFaults requires the explorer to find every seeded fault, and prints the
// shortest counterexample of each.
func TestExploreFindsSeededFaults(t *testing.T) {
	for _, tc := range seededFaults {
		t.Run(tc.name, func(t *testing.T) {
			best := shortestCounterexample(tc.fault)
			if best == nil {
				t.Fatalf("the explorer found no counterexample for the fault %q", tc.name)
			}
			fmt.Printf("explore: seeded fault %q: shortest counterexample, %s", tc.name, best.trace)
			if !containsAny(best.violation.message, strings.Split(tc.invariant, "|")) {
				t.Fatalf("the explorer found a violation, but not of %s:\n%s", tc.invariant, best.trace)
			}
		})
	}
}

// writeReport writes docs/exploration.md: the bounds, the states, the transitions taken by the
// exploration and by a repeatable rapid sample, and the shortest counterexample of every seeded
// fault. It holds no timings, so that the same code gives the same file.
func writeReport(t *testing.T, results []exploreResult, reached map[Edge]int) {
	rapidtb.SetFlag(t, "rapid.seed", reportRapidSeed)
	rapidtb.SetFlag(t, "rapid.checks", fmt.Sprint(reportRapidChecks))
	rapidCoverage.reset()
	rapid.Check(t, runModel(faults{}))
	runs, sampled := rapidCoverage.get()

	var b strings.Builder
	b.WriteString("# Exploration report\n\n")
	b.WriteString("Generated by `make explore` (`go test ./fsm -run '^TestExplore$' -explore.report=docs/exploration.md`);\n")
	b.WriteString("do not edit. [evidence.md](evidence.md) says what it proves and what it does not.\n\n")
	b.WriteString("## Bounds and states\n\n")
	b.WriteString("| configuration | starting worlds | depth | distinct states | new states per level | actions run |\n|---|---|---|---|---|---|\n")
	for i, r := range results {
		var roots []string
		for _, s := range exploreSpecs[i].roots {
			roots = append(roots, s.name)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %v | %d |\n", r.cfg, strings.Join(roots, "; "), r.depth, r.states, r.perLevel, r.runs)
	}
	fmt.Fprintf(&b, "\n## Transitions of `fsm.Configure` taken\n\n")
	fmt.Fprintf(&b, "Exploration: the first depth at which an interleaving took the transition. rapid: how often %d\n", runs)
	fmt.Fprintf(&b, "interleavings (seed %s, the model's starting worlds and actions) took it.\n\n", reportRapidSeed)
	b.WriteString("| from | trigger | to | exploration (depth) | rapid (times) |\n|---|---|---|---|---|\n")
	var never []string
	for _, e := range sortedEdges(permittedEdges()) {
		depth := "never"
		if level, ok := reached[e]; ok {
			depth = fmt.Sprint(level)
		} else if root, ok := transitionsOnlyFrom[e]; ok {
			depth = "only from \"" + root + "\" (an open finding)"
		}
		if _, ok := reached[e]; !ok && sampled[e] == 0 && transitionsOnlyFrom[e] == "" {
			never = append(never, e.String())
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d |\n", e.From, e.Trigger, e.To, depth, sampled[e])
	}
	// A transition neither the exploration nor the rapid sample takes is dead (remove it from
	// Configure) or needs an interleaving beyond both (show it): a finding either way.
	if len(never) > 0 {
		t.Errorf("transitions no interleaving took: %v", never)
		fmt.Fprintf(&b, "\nNever taken: %s.\n", strings.Join(never, ", "))
	} else {
		b.WriteString("\nEvery transition the machine permits is taken by the exploration or the rapid sample: no dead edge.\n")
	}
	b.WriteString("\n## Open findings\n\n")
	for _, root := range sortedKeys(openFindings) {
		fmt.Fprintf(&b, "- From \"%s\": %s.\n", root, openFindings[root])
	}
	b.WriteString("\n## Seeded faults: shortest counterexamples\n\n")
	b.WriteString("Each fault breaks one controller on purpose; the explorer must find a violation of the named check.\n")
	b.WriteString("The starting world is built by the correct controllers; the broken ones take over from there.\n\n")
	for _, tc := range seededFaults {
		best := shortestCounterexample(tc.fault)
		if best == nil {
			fmt.Fprintf(&b, "### %s\n\nnot found within the default depths\n\n", tc.name)
			continue
		}
		fmt.Fprintf(&b, "### %s\n\nCaught by: `%s`.\n\n```text\n%s```\n\n", tc.name, tc.invariant, best.trace)
	}
	out := strings.TrimRight(b.String(), "\n") + "\n"
	if err := os.WriteFile(*exploreReport, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	fmt.Println("explore: wrote", *exploreReport)
}
