package fsm

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kmm-project/kmm/test/rapidtb"
)

// TestMain lengthens rapid's interleavings for this package (unless -rapid.steps is given): the
// interesting races need a module loaded first.
func TestMain(m *testing.M) {
	flag.Parse()
	if !flagSet("rapid.steps") {
		_ = flag.Set("rapid.steps", "80")
	}
	os.Exit(m.Run())
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// TestModelInvariants is the property test: random interleavings of Module edits, reboots, kernel
// upgrades, NotReady/Ready flaps, cordons, version-label changes, worker outcomes, operator restarts,
// write conflicts and stale caches, with the invariants of SPEC §4 checked after every step and
// convergence checked at the end. `make test` runs it with RAPID_CHECKS=10000.
func TestModelInvariants(t *testing.T) {
	clear(visitedEdges)
	rapid.Check(t, runModel(faults{}))

	// Coverage is asserted only on a run long enough to reach it (short mode runs a few dozen).
	checks, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String())
	visitedStates := map[State]bool{}
	for e := range visitedEdges {
		visitedStates[e.To] = true
	}
	for _, s := range States {
		if !visitedStates[s] && checks >= 1000 {
			t.Errorf("no interleaving reached state %s: the model does not exercise it", s)
		}
	}
	var missed []string
	for e := range permittedEdges() {
		if visitedEdges[e] == 0 {
			missed = append(missed, fmt.Sprintf("%s --%s--> %s", e.From, e.Trigger, e.To))
		}
	}
	t.Logf("transitions exercised: %d of %d; never taken: %v", len(permittedEdges())-len(missed), len(permittedEdges()), missed)
	if checks >= 1000 && len(missed)*5 > len(permittedEdges()) {
		t.Errorf("the model took fewer than 80%% of the machine's transitions")
	}
}

// TestSeededFaultsAreCaught runs the property test against deliberately broken controllers and
// requires rapid to find a counterexample naming the invariant each one breaks.
func TestSeededFaultsAreCaught(t *testing.T) {
	rapidtb.SetFlag(t, "rapid.nofailfile", "true")
	rapidtb.SetFlag(t, "rapid.shrinktime", "3s")
	// Each fault needs a particular interleaving; search long enough to find it every time (rapid
	// stops at the first counterexample, so this costs little).
	if checks, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String()); checks < 3000 {
		rapidtb.SetFlag(t, "rapid.checks", "3000")
	}
	cases := []struct {
		name      string
		fault     faults
		invariant string
	}{
		{"the NMC decision ignores Ready", faults{nmcIgnoresReady: true}, "invariant 4"},
		{"the Module→NMC decision reads node status", faults{specReadsNodeStatus: true}, "invariant 1"},
		{"unload starts while the device plugin pod runs", faults{unloadIgnoresDevicePlugin: true}, "invariant 6"},
		// A missed reboot shows up as a pair that never converges, or as a later load over what the
		// controller still believes is loaded: either is a catch.
		{"reboots go unnoticed", faults{ignoresReboots: true}, "invariant 7|invariant 6"},
		// Issue 13: a failed pod whose config cannot be read was taken for a replaced config and
		// retried at once, thousands of pods a minute.
		{"a failed pod's config is read as empty", faults{failedEntryUnread: true}, "back-off|invariant 7"},
		{"worker pods never time out", faults{noWorkerTimeout: true}, "invariant 7"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := rapidtb.New(t)
			rapid.Check(rec, runModel(tc.fault))
			if !rec.Failed() {
				t.Fatalf("rapid found no counterexample for the fault %q", tc.name)
			}
			t.Logf("counterexample: %s", rec.Messages())
			if all := rec.Messages(); !containsAny(all, strings.Split(tc.invariant, "|")) {
				t.Fatalf("rapid failed, but not on %s:\n%s", tc.invariant, all)
			}
		})
	}
}

// TestBackOffPropertyCatchesTheRetryStorm scripts the interleaving of issue 13 (a load fails and
// its pod's config reads as empty) and requires the back-off property to fail with the fault and
// hold without it.
func TestBackOffPropertyCatchesTheRetryStorm(t *testing.T) {
	for _, fault := range []bool{false, true} {
		w := newWorld(faults{failedEntryUnread: fault})
		m := &model{w: w}
		m.ControllersCatchUp(nil)
		p := w.pods[podName("n0", "plain")]
		if p == nil || p.action != ActionLoad {
			t.Fatalf("no load pod after the first reconciles: %s", w.describe())
		}
		w.finishPod(p, false)
		for range 3 {
			w.remember()
			w.reconcileNMC("n0", 0)
		}
		caught := strings.Contains(strings.Join(w.violations, "\n"), "back-off")
		if caught != fault {
			t.Errorf("fault %v: back-off violation found %v; violations %v; %s", fault, caught, w.violations, w.describe())
		}
	}
}

// FuzzModel runs the same property as TestModelInvariants from fuzzer-chosen inputs.
func FuzzModel(f *testing.F) {
	f.Fuzz(rapid.MakeFuzz(runModel(faults{})))
}

// FuzzLabelKeys checks that every label key the operator builds for a valid Module name stays a
// valid Kubernetes label key (the 39-character budget of seed 002).
func FuzzLabelKeys(f *testing.F) {
	f.Add("default", "nic")
	f.Add("a-namespace-of-twenty", "module-name-eighteen")
	f.Fuzz(func(t *testing.T, ns, name string) {
		checkLabelKeys(t, ns, name)
	})
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
