package scale_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/scale"
)

// TestSmoke runs the harness at 10 nodes x 1 Module and checks that the numbers are sane; the
// real runs are `make bench-scale`.
func TestSmoke(t *testing.T) {
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "manager")
	build := exec.Command("go", "build", "-o", bin, "./cmd/manager")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the operator: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := scale.Run(ctx, scale.Options{Nodes: 10, Modules: 1, Manager: bin, Timeout: time.Minute, OutDir: t.TempDir(),
		FloorConcurrency: []int{4}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Phases) != 4 {
		t.Fatalf("want 4 phases, got %+v", res.Phases)
	}
	load, resync, bump := res.Phases[0], res.Phases[1], res.Phases[2]
	checkFloor(t, res, load, res.Phases[3])
	// One NMC apply per pair; a Module reconcile that runs before the cache shows its own apply
	// applies the same entry again (a no-op on the server), which a loaded 2-core machine does for
	// a few pairs (13 of 10 seen once in a full `go test ./...`): allow that, not a second round.
	if applies := load.OperatorRequests["APPLY nodemodulesconfigs"]; applies < 10 || applies > 15 {
		t.Errorf("load: want one NMC apply per pair (10, up to 15 with stale-cache repeats), got %v", load.OperatorRequests)
	}
	if load.WritesPerPairNoEvents < 3 || load.WritesPerPairNoEvents > 10 {
		t.Errorf("load: %.2f writes per pair without Events is not plausible: %v", load.WritesPerPairNoEvents, load.OperatorRequests)
	}
	// Events are off the happy path (issue 22): a load gives a few per Module (the aggregated
	// series of its two transitions and the Module's own InProgress and AllLoaded), none per pair.
	if load.EventWrites > 8*res.Modules {
		t.Errorf("load: %d Event writes for %d pairs of %d Module(s), want at most 8 per Module: %v",
			load.EventWrites, res.Pairs, res.Modules, load.OperatorRequests)
	}
	// Neither upgrade controller has anything to do for a Module without a version or an
	// upgradePolicy, and neither is woken up for one (issue 22).
	for _, p := range []scale.Phase{load, bump} {
		if n := p.Reconciles["version-labels"] + p.Reconciles["upgrade-rollout"]; n != 0 {
			t.Errorf("%s: %v reconciles, want none of version-labels and upgrade-rollout for Modules without a version", p.Name, p.Reconciles)
		}
	}
	sum := 0.0
	for _, v := range load.WritesPerPairByKind {
		sum += v
	}
	if d := sum - load.WritesPerPair; d > 0.001 || d < -0.001 || load.WritesPerPairByKind["POST events"]*float64(res.Pairs) != float64(load.OperatorRequests["POST events"]) {
		t.Errorf("load: writes per pair by kind %v do not add up to %.2f (Events included)", load.WritesPerPairByKind, load.WritesPerPair)
	}
	if load.BodyBytesPerWrite["patch nodemodulesconfigs"] <= 0 {
		t.Errorf("load: no request body size for the NMC applies: %v", load.BodyBytesPerWrite)
	}
	if load.OtherCPUSeconds["kube-apiserver"] <= 0 || load.OtherCPUSeconds["etcd"] <= 0 {
		t.Errorf("load: the CPU of kube-apiserver and etcd was not measured: %v", load.OtherCPUSeconds)
	}
	if resync.Reconciles["nmc"] < res.Nodes || resync.Reconciles["module"] < res.Modules {
		t.Errorf("resync: %v reconciles, want every NMC (%d) and Module (%d) reconciled again", resync.Reconciles, res.Nodes, res.Modules)
	}
	if resync.OperatorWrites != 0 {
		t.Errorf("resync: want no write, got %v", resync.OperatorRequests)
	}
	if bump.OperatorWrites == 0 || load.PeakRSSMiB <= 0 || load.CPUSeconds <= 0 {
		t.Errorf("implausible: bump writes %d, peak RSS %.0f MiB, CPU %.2f s", bump.OperatorWrites, load.PeakRSSMiB, load.CPUSeconds)
	}
}

// checkFloor checks that the floor made exactly kmm's happy-path writes of a load at x 1 (issue
// 41), one NMC status write Loading and one Loaded per pair, that kmm's load made the same
// writes, and that the ratio was reported. kmm's load once repeated a status write and a label
// patch for 1-2 of the 10 pairs in about one run of three: a reconcile read the node from a cache
// that had not seen kmm's own label patch yet (TestOwnLabelPatchNotRepeatedOnALaggingNodeCache in
// controllers makes that lag every time; the NMC controller now decides on its patch's answer).
func checkFloor(t *testing.T, res *scale.Result, load, floor scale.Phase) {
	t.Helper()
	want := map[string]float64{"APPLY nodemodulesconfigs": 1, "PUT nodemodulesconfigs/status": 2, "POST pods": 1, "DELETE pods": 1, "PATCH nodes": 1}
	if len(floor.WritesPerPairByKind) != len(want) {
		t.Errorf("floor: writes per pair %v, want %v", floor.WritesPerPairByKind, want)
	}
	for k, v := range want {
		if floor.WritesPerPairByKind[k] != v {
			t.Errorf("floor: %s = %.2f per pair, want %.0f (all: %v)", k, floor.WritesPerPairByKind[k], v, floor.WritesPerPairByKind)
		}
		if k == "APPLY nodemodulesconfigs" {
			continue
		}
		if got := load.WritesPerPairByKind[k]; got != v {
			t.Errorf("load: %s = %.2f per pair, the floor's %.0f: the floor no longer mirrors kmm (%v)",
				k, got, v, load.WritesPerPairByKind)
		}
	}
	if f := res.Floor; f == nil || f.Ratio <= 0 || f.FloorSeconds <= 0 || f.FloorSeconds > floor.SettledSeconds {
		t.Errorf("floor: implausible ratio %+v (floor phase settled in %.1f s)", res.Floor, floor.SettledSeconds)
	}
	if floor.APIServerCPUMillisPerPair <= 0 || floor.NMCStatusWriteBytes <= 0 || load.NMCStatusWriteBytes <= 0 {
		t.Errorf("floor: no kube-apiserver CPU per pair (%.1f ms) or NMC status write size (%.0f, load %.0f)",
			floor.APIServerCPUMillisPerPair, floor.NMCStatusWriteBytes, load.NMCStatusWriteBytes)
	}
}
