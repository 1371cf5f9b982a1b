package fsm

import (
	"flag"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/kmm-project/kmm/contract"
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
// upgrades, NotReady/Ready flaps, cordons, version-label changes, worker outcomes, drains, operator
// restarts, write conflicts and stale caches, with the invariants of SPEC §4 checked after every
// step and convergence checked at the end. `make test` runs it with RAPID_CHECKS=10000.
func TestModelInvariants(t *testing.T) {
	rapidCoverage.reset()
	rapid.Check(t, runModel(faults{}))
	runs, edges := rapidCoverage.get()
	var missed []string
	for _, e := range sortedEdges(permittedEdges()) {
		if edges[e] == 0 {
			missed = append(missed, e.String())
		}
	}
	t.Logf("%d interleavings took %d of the machine's %d transitions; never taken: %v", runs, len(permittedEdges())-len(missed), len(permittedEdges()), missed)
	// Coverage is asserted only on a run long enough to reach it (`make test`'s 10,000; short mode
	// and a plain `go test` run a few dozen). The explorer's coverage does not depend on luck:
	// TestExplore asserts it on every run.
	if runs >= 5000 && len(missed)*5 > len(permittedEdges()) {
		t.Errorf("%d interleavings took fewer than 80%% of the machine's transitions", runs)
	}
}

// coverage counts the transitions the model made over many runs.
type coverage struct {
	mu    sync.Mutex
	runs  int
	edges map[Edge]int
}

// rapidCoverage is what TestModelInvariants's interleavings reached.
var rapidCoverage coverage

func (c *coverage) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs, c.edges = 0, map[Edge]int{}
}

func (c *coverage) add(fired []Edge) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.edges == nil {
		c.edges = map[Edge]int{}
	}
	c.runs++
	for _, e := range fired {
		c.edges[e]++
	}
}

func (c *coverage) get() (int, map[Edge]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs, maps.Clone(c.edges)
}

// TestSeededFaultsAreCaught runs the property test against deliberately broken controllers and
// requires rapid to find a counterexample naming the invariant each one breaks.
func TestSeededFaultsAreCaught(t *testing.T) {
	rapidtb.SetFlag(t, "rapid.nofailfile", "true")
	rapidtb.SetFlag(t, "rapid.shrinktime", "200ms") // the explorer gives the shortest counterexamples
	// Each fault needs a particular interleaving; search long enough to find it every time (rapid
	// stops at the first counterexample, so this costs little).
	// (Short mode runs a fifth of rapid.checks.)
	want := 3000
	if testing.Short() {
		want *= 5
	}
	if checks, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String()); checks < want {
		rapidtb.SetFlag(t, "rapid.checks", strconv.Itoa(want))
	}
	for _, tc := range seededFaults {
		t.Run(tc.name, func(t *testing.T) {
			rec := rapidtb.New(t)
			rapid.Check(rec, runModel(tc.fault))
			if !rec.Failed() {
				t.Fatalf("rapid found no counterexample for the fault %q", tc.name)
			}
			// rapid stops at the first check an interleaving breaks, and a random seed may reach
			// the fault's effect through another check before the one the explorer's shortest
			// counterexample names (seed 18319502463815002411 caught the stranded record through
			// invariant 6, a load over a config still in the kernel, before invariant 7): any of the
			// model's checks is a catch, and the fault-free TestModelInvariants shows none of them
			// fails without a fault. A panic or another error of the model is not.
			all := rec.Messages()
			if !containsAny(all, modelChecks) {
				t.Fatalf("rapid failed, but not on one of the model's checks (%v):\n%s", modelChecks, all)
			}
			named := containsAny(all, strings.Split(tc.invariant, "|"))
			t.Logf("counterexample (on the named check %s: %v): %s", tc.invariant, named, all)
		})
	}
}

// TestBackOffPropertyCatchesTheRetryStorm scripts the interleaving of issue 13 (a load fails and
// its pod's config reads as empty) and requires the back-off property to fail with the fault and
// hold without it.
func TestBackOffPropertyCatchesTheRetryStorm(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := rapidConfig(false)
		w := newWorld(&cfg, faults{failedEntryUnread: fault})
		w.catchUp()
		p := w.pods[podName("n0", "plain")]
		if p == nil || p.action != contract.ActionLoad {
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

// runModel is one random interleaving followed by the convergence check.
func runModel(f faults) func(*rapid.T) {
	return func(t *rapid.T) {
		cfg := rapidConfig(rapid.Bool().Draw(t, "automatic rollout"))
		cfg.plainWithoutDevicePlugin = rapid.Bool().Draw(t, "plain Module without a device plugin")
		cfg.dra = rapid.Bool().Draw(t, "DRA drivers in place of device plugins")
		cfg.hooks = rapid.Bool().Draw(t, "the versioned Module has hooks")
		start := startingWorlds[rapid.IntRange(0, len(startingWorlds)-1).Draw(t, "starting world")]
		w := start.start(&cfg, f)
		defer func() { rapidCoverage.add(w.fired) }()
		t.Repeat(rapidActions(w))
		if !w.settle(maxSettleRounds) {
			t.Fatalf("invariant 7: the world did not settle within %d rounds of reconciles: %s", maxSettleRounds, w.describe())
		}
		w.check()
		w.checkConverged()
		if len(w.violations) > 0 {
			t.Fatalf("%s", w.violations[0])
		}
	}
}

// modelChecks are the prefixes of the messages of the model's checks: the invariants of SPEC §4,
// the drain's, the back-off's and the claims' properties.
var modelChecks = []string{"invariant ", "drain: ", "back-off: ", "claims: ", "hooks: "}

// seededFaults are the broken controllers the property test and the explorer must catch, with the
// check (a prefix of its message) the explorer's shortest counterexample fails on; the property
// test accepts any of modelChecks (TestSeededFaultsAreCaught says why).
var seededFaults = []struct {
	name      string
	fault     faults
	invariant string
}{
	{"the NMC decision ignores Ready", faults{nmcIgnoresReady: true}, "invariant 4"},
	{"the Module→NMC decision reads node status", faults{specReadsNodeStatus: true}, "invariant 1"},
	{"unload starts while the device plugin pod runs", faults{unloadIgnoresDevicePlugin: true}, "invariant 6"},
	// A missed reboot shows up as a pair that never converges, or as a later load over what the
	// controller still believes is loaded: either is a catch.
	// (or as kmm's cordon of an upgrade that never goes on: the pair is stuck, invariant 7's drain part)
	{"reboots go unnoticed", faults{ignoresReboots: true}, "invariant 7|invariant 6|drain: kmm's cordon"},
	// Issue 13: a failed pod whose config cannot be read was taken for a replaced config and
	// retried at once, thousands of pods a minute.
	{"a failed pod's config is read as empty", faults{failedEntryUnread: true}, "back-off|invariant 7"},
	{"worker pods never time out", faults{noWorkerTimeout: true}, "invariant 7"},
	{"the back-off does not grow", faults{flatBackOff: true}, "back-off"},
	// A cache that does not show the pod just created yet: only the pod's deterministic name keeps
	// a second one from being made.
	// (The second pod of a pair may first show as a retry the back-off did not allow.)
	{"worker pods get generated names", faults{podGenerateName: true}, "invariant 3|back-off"},
	{"the status write drops the newest log entry", faults{logSkipsTransition: true}, "invariant 8"},
	{"the drain forgets its cordon", faults{cordonForgotten: true}, "drain: kmm's cordon|invariant 7"},
	{"the rollout does not count nodes in progress", faults{rolloutIgnoresInProgress: true}, "drain: 2 nodes cordoned|drain: 3 nodes cordoned"},
	// Issue 18: upstream KMM's record of a Module deleted before the takeover was dropped as Absent
	// while the module stayed in the kernel.
	{"a stranded record is dropped", faults{strandedRecordDropped: true}, "invariant 7"},
	// Issue 22: an image bump is one reload worker only when nothing must be drained between its
	// unload and its load, and its unload half unloads what is loaded.
	{"a reload is chosen beside the device plugin pod", faults{reloadIgnoresDevicePlugin: true}, "invariant 6: reload"},
	{"a reload unloads the new config", faults{reloadUnloadsNewConfig: true}, "invariant 6: reload pod"},
	// Issue 34: a drain with an empty podSelector evicted the worker pods of other Modules.
	{"the drain evicts kmm's worker pods", faults{drainSeesKMMPodsAsWork: true}, "drain: the drain of"},
	// Issue 36: an allocated ResourceClaim of the Module's DRA driver holds the unload (and the
	// driver) until it is released.
	{"the NMC decision ignores allocated ResourceClaims", faults{unloadIgnoresClaims: true}, "claims: "},
	{"a DRA driver goes with its Module being deleted", faults{draDriverGoesWithModule: true}, "claims: the DRA driver"},
	{"the ready label ignores allocated ResourceClaims", faults{readyIgnoresClaims: true}, "claims: the ready label"},
	// Issue 40: the Module's hooks run in every load and unload pod; a skipped preUnload hook
	// leaves the devices bound (modprobe -r fails), a skipped postLoad hook a ready node whose
	// hook never ran.
	{"a hook skipped", faults{hookSkipped: true}, "hooks: "},
	// Issue 40, item 6: the pods that use the Module's devices are drained though the podSelector
	// does not select them, and the pods of Jobs are waited for before they are evicted.
	{"the drain misses a pod using the Module's devices", faults{drainMissesDeviceUsers: true}, "drain: unload pod|drain: reload pod"},
	{"the drain evicts a Job's pod while it waits", faults{jobPodsUnseen: true}, "drain: the drain of ns/versioned on n0 touches the Job pod"},
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

// TestRolloutCountsADoneNodeStillCordoned scripts the interleaving in which kmm's uncordon of a
// node that finished its upgrade is refused, and the rollout starts the next node: counting only the
// nodes that are not done (upgrade.PlanRollout's old rule, the fault rolloutDoneIgnoresCordon), kmm then
// holds two cordons with maxUnavailable 1; counting every cordoned node, as docs/api.md says the
// budget does, it holds one. (Eight steps from the starting world: beyond the explorer's depth.)
func TestRolloutCountsADoneNodeStillCordoned(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := exploreSpecs[1].cfg
		w := rootUpgrading.start(&cfg, faults{rolloutDoneIgnoresCordon: fault})
		n0, n1 := cfg.nodes[0], cfg.nodes[1]
		steps := []func(){
			func() { w.finishPod(w.livePod(n0, modVersion), true) }, // v1 unloaded
			w.catchUp, // Upgrading
			w.catchUp, // the worker-pod label moves to v2
			w.catchUp, // the v2 entry; Loading
			func() { w.finishPod(w.livePod(n0, modVersion), true) },                     // v2 loaded
			func() { w.refuseNode = true; w.reconcileNMC(n0, 0); w.refuseNode = false }, // Loaded; the uncordon is refused
			w.reconcileRollout, // n0 is done: n1 may start?
			func() { w.remember(); w.reconcileNMC(n1, 0) }, // n1 drains, and cordons
		}
		for _, step := range steps {
			step()
			w.remember()
			w.check()
		}
		caught := strings.Contains(strings.Join(w.violations, "\n"), "nodes cordoned by kmm")
		if caught != fault {
			t.Errorf("rollout ignoring done cordoned nodes %v: maxUnavailable violation found %v; violations %v; %s", fault, caught, w.violations, w.summary())
		}
	}
}

// TestStaleReconcileDoesNotRelabel scripts the interleaving rapid found: a reconcile from a cache
// three writes old decides that a pair is Loaded, which changes nothing in that (stale) status, and
// puts the ready label back while the pair is unloading; the device plugin DaemonSet follows, beside
// the running unload pod (invariant 6). The status write, with its resourceVersion check, must come
// before any relabel, not only before a pod (the fault onlyCreatesCheckFreshness is the old rule).
func TestStaleReconcileDoesNotRelabel(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := rapidConfig(false)
		w := rootAllLoaded.start(&cfg, faults{onlyCreatesCheckFreshness: fault})
		steps := []func(){
			func() { w.modules[modPlain].gen++; w.reconcileModule(modPlain) }, // a new image: spec changed
			func() { w.reconcileNMC("n0", 0) },                                // DevicePluginDraining, the ready label goes
			func() { w.reconcileDaemonSets("n0") },                            // the device plugin pod goes
			func() { w.reconcileNMC("n0", 0) },                                // Unloading, the unload pod runs
			func() { w.reconcileNMC("n0", 3) },                                // from the cache of before the edit: Loaded
			func() { w.reconcileDaemonSets("n0") },                            // the device plugin comes back if the label did
		}
		for _, step := range steps {
			step()
			w.remember()
			w.check()
		}
		caught := strings.Contains(strings.Join(w.violations, "\n"), "invariant 6")
		if caught != fault {
			t.Errorf("only creates check freshness %v: invariant 6 violated %v; violations %v; %s", fault, caught, w.violations, w.summary())
		}
	}
}

// TestBumpDuringRolloutRetargets replays a finding rapid made: with an automatic rollout, a second
// version bump while a node is on its way to the first (and another node cordoned, so that no
// pending node may start) used to leave that node's label at the first version, kmm's own cordon on
// it and its spec entry at the old version; the rollout never started a cordoned node, so it
// stalled for good. The rollout now retargets a node in progress to a version the Module no longer
// has (the fault rolloutNeverRetargets is the old rule).
func TestBumpDuringRolloutRetargets(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := rapidConfig(true)
		w := rootFresh.start(&cfg, faults{rolloutNeverRetargets: fault})
		w.catchUp()
		w.catchUp()
		w.bumpVersion()               // v2
		w.catchUp()                   // the rollout starts n0
		w.bumpVersion()               // v3, while n0 is on its way to v2
		w.nodes["n1"].cordoned = true // the user cordons n1: the budget is used up
		w.reconcileLabels("n0")
		w.finishPod(w.livePod("n0", modVersion), true)
		w.catchUp() // n0 drains, cordoned by kmm
		w.remember()
		w.settle(maxSettleRounds)
		w.check()
		w.checkConverged()
		stalled := strings.Contains(strings.Join(w.violations, "\n"), "kmm's cordon of n0")
		if stalled != fault {
			t.Errorf("rollout never retargets %v: stalled %v; violations %v; %s", fault, stalled, w.violations, w.summary())
		}
	}
}
