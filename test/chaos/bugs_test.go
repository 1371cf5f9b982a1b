//go:build chaos

package chaos_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kmm-project/kmm/test/chaos"
	"github.com/kmm-project/kmm/test/chaos/seededbug"
)

// noFaults runs the seeded bugs without their faults: the control that shows the fault is what
// exposes each (go test -tags chaos ./test/chaos -run TestSeededBugs -chaos.bugs-unfaulted).
var noFaults = flag.Bool("chaos.bugs-unfaulted", false, "run the seeded bugs without their faults (the control: none may be caught)")

// noBugs runs the aimed faults against managers without the bugs: the control that shows the bug,
// not the fault alone, is what breaks the invariant (-chaos.bugs-off: no violation may be reported).
var noBugs = flag.Bool("chaos.bugs-off", false, "run the seeded bugs' aimed faults without the bugs (the control: no violation may be reported)")

// seededBug is one seeded bug, the fault aimed at the moment that exposes it, and the invariant
// whose violation proves the watcher caught it.
type seededBug struct {
	bug string
	aim chaos.Aim
	// duration is the fault phase; a bug caught as a stall is reported at its end plus the
	// convergence bound.
	duration time.Duration
	// lease is the replicas' lease duration, renew deadline and retry period (nil: the harness's
	// short default), longer for the bugs a control-plane outage exposes: the outage must not cost
	// the leader its Lease (a new process reads everything again and does not fall for the bug).
	lease []time.Duration
	// caught is a piece of the violation text that must appear.
	caught string
	// stopDelay is how long a deleted device plugin pod goes on running (chaos.Options.StopDelay).
	stopDelay time.Duration
}

const (
	workerPods      = "/namespaces/" + chaos.Namespace + "/pods"
	nodesPath       = "/api/v1/nodes/"
	nmcs            = "/nodemodulesconfigs/"
	workloadQuery   = "kmm-chaos%2Fuses"
	devicePluginSel = "kmm.sigs.x-k8s.io%2Fdevice-plugin"
)

var seededBugs = []seededBug{
	{
		// The leader is killed right after kmm's cordon: the next process does not lift it and the
		// rollout (maxUnavailable 1) stalls behind the cordoned node.
		bug: seededbug.ForgetCordon, aim: chaos.Aim{Kind: chaos.FaultKill, Phase: chaos.PhaseUpgrade, Method: "PATCH", Path: nodesPath, Body: `"unschedulable":true`},
		duration: 30 * time.Second, caught: "cordoned",
	},
	{
		// The leader is partitioned as the upgrade starts; once it lost the Lease it keeps leading.
		bug: seededbug.KeepLeading, aim: chaos.Aim{Kind: chaos.FaultPartition, Phase: chaos.PhaseUpgrade, Method: "PUT", Path: nmcs},
		duration: 40 * time.Second, caught: "held the Lease",
	},
	{
		// Every list of the drain's pods fails with 500 for 20 s: taken as "no pods", the drain
		// evicts nothing and the unload runs under the workload once the device plugin left.
		bug: seededbug.ErrorAsNoPods, aim: chaos.Aim{Kind: chaos.FaultServerError, Phase: chaos.PhaseUpgrade, Method: "GET", Path: "/pods", Query: workloadQuery, For: 20 * time.Second},
		duration: 40 * time.Second, caught: "workload pod using it",
	},
	{
		// The first load pod's create is answered 3 s late: retried under a fresh name, two pods.
		bug: seededbug.SlowCreateRenamed, aim: chaos.Aim{Kind: chaos.FaultDelay, Phase: chaos.PhaseLoad, Method: "POST", Path: workerPods, Body: "kmm-worker-", Hold: 3 * time.Second},
		duration: 30 * time.Second, caught: "2 worker pods",
	},
	{
		// The leader's watches are cut as it deletes its first finished load pod, and its pod
		// watches answered 410 for 2 s: the relist shows the deletion as a tombstone, the bug
		// ignores it, and the pair never gets its unload pod in the upgrade.
		bug: seededbug.TombstoneIgnored, aim: chaos.Aim{Kind: chaos.FaultWatchCut, Phase: chaos.PhaseLoad, Method: "DELETE", Path: "/pods/kmm-worker-", Hold: 2 * time.Second},
		duration: 30 * time.Second, caught: "not converged",
	},
	{
		// kmm's first uncordon meets a 409: the bug leaves the cordon to "whoever changed the node".
		bug: seededbug.ConflictDisownsCordon, aim: chaos.Aim{Kind: chaos.FaultConflict, Phase: chaos.PhaseUpgrade, Method: "PATCH", Path: nodesPath, Body: `"unschedulable":false`},
		duration: 30 * time.Second, caught: "cordoned",
	},
	{
		// The live reads of the device plugin pods are throttled for 5 s as the Module is deleted:
		// the check is skipped, the unload pod comes while the device plugin pod runs.
		bug: seededbug.ThrottleSkipsDPCheck, aim: chaos.Aim{Kind: chaos.FaultThrottle, Phase: chaos.PhaseDelete, Method: "GET", Path: "/pods", Query: devicePluginSel, For: 5 * time.Second},
		duration: 40 * time.Second, caught: "device plugin pod is there",
	},
	{
		// The answers to the live reads of the device plugin pods are held back 1 s for 5 s as the
		// Module is deleted, as a kube-apiserver waiting on a restarting etcd holds them: the read
		// runs out of the bug's 300 ms, is taken as "none", and the unload pod comes while the
		// device plugin pod, deleted with its DaemonSet, still stops (2 s, as a kubelet waits for
		// its container to end on SIGTERM). An aimed etcd restart exposed the bug only sometimes:
		// the clean-clone CI runs of 90a6eb3 and 9419a80 missed it (kube-apiserver may fail such a
		// read at once instead of waiting, and a failed read is retried, not taken as "none"); and
		// with device plugin pods that go the moment they are deleted, the 300 ms of a stalled read
		// are enough for them to be gone.
		bug: seededbug.StallAsNoDevicePlugin, aim: chaos.Aim{Kind: chaos.FaultDelay, Phase: chaos.PhaseDelete, Method: "GET", Path: "/pods", Query: devicePluginSel, For: 5 * time.Second, Hold: time.Second},
		duration: 40 * time.Second, caught: "device plugin pod is there", stopDelay: 2 * time.Second,
	},
	{
		// kube-apiserver is killed as the leader deletes its first finished load pod, and the DELETE
		// forwarded into the outage: the proxy answers 502, as a load balancer in front of a
		// restarting kube-apiserver does, and the pod is not deleted. The bug takes it as deleted
		// and strikes it from its facts; no delete event comes, so the finished pod is left and the
		// load never converges. Lease 60 s / 45 s / 2 s: the in-place restart (8-22 s from SIGKILL
		// to ready on this machine) must not cost the leader its Lease and its memory.
		bug: seededbug.LostAnswerAsDeleted, aim: chaos.Aim{Kind: chaos.FaultAPIServerRestart, Phase: chaos.PhaseLoad, Method: "DELETE", Path: "/pods/kmm-worker-", Into: true},
		duration: 30 * time.Second, lease: apiserverLease, caught: "not converged",
	},
}

// aimSettle ends a seeded bug's fault phase this long after its aim has done its work: a bug
// caught as a stall is reported then plus the convergence bound, not at the end of its duration.
const aimSettle = 8 * time.Second

// The leases of the runs with a control-plane outage (seededBug.lease).
var (
	apiserverLease = []time.Duration{60 * time.Second, 45 * time.Second, 2 * time.Second}
)

// bugSeeds is how many seeds each seeded bug runs with: 1 in `make chaos` (the bug must be caught
// with -chaos.seed), 10 in `make chaos-catch-rate`, which measures each bug's catch rate.
var bugSeeds = flag.Int("chaos.bug-seeds", 1, "seeds each seeded bug runs with (-chaos.seed, -chaos.seed+1, ...); with more than one, a bug must be caught with at least 9 in 10 of them")

// minCatchRate is the share of seeds a seeded bug must be caught with (issue 34): a bug caught
// less often needs a better aimed fault, not a retry.
const minCatchRate = 0.9

// TestSeededBugs runs, for each seeded bug of test/chaos/seededbug, the manager with it planted
// (test/chaos/kmm-manager-seeded) under the one fault that exposes it, aimed at the moment it
// matters (chaos.Aim), and checks that the watcher reports the violation it causes. With
// -chaos.bugs-unfaulted it runs them without the faults and checks that none is caught; with
// -chaos.bugs-off it runs the same command with no bug planted and checks that nothing breaks. Each bug runs once per seed of -chaos.bug-seeds; there
// is no retry: docs/reliability.md gives each bug's measured catch rate over 10 seeds, and a bug
// below minCatchRate needs a better aimed fault.
func TestSeededBugs(t *testing.T) {
	bin := buildManager(t, "./test/chaos/kmm-manager-seeded")
	for _, sb := range seededBugs {
		t.Run(sb.bug, func(t *testing.T) {
			t.Parallel()
			var missed []uint64
			for i := range *bugSeeds {
				s := *seed + uint64(i)
				if !runSeededBug(t, bin, sb, s) {
					missed = append(missed, s)
				}
			}
			caught := *bugSeeds - len(missed)
			t.Logf("catch rate: %s caught with %d of %d seeds (missed: %v)", sb.bug, caught, *bugSeeds, missed)
			if float64(caught) < minCatchRate*float64(*bugSeeds) {
				t.Errorf("the watcher caught the seeded bug %s with %d of %d seeds (missed %v; want at least %.0f%%): aim its fault better",
					sb.bug, caught, *bugSeeds, missed, 100*minCatchRate)
			}
		})
	}
}

// runSeededBug runs one seeded bug with seed and says whether it was caught (the controls fail t
// on a catch, or a violation, that must not be).
func runSeededBug(t *testing.T, bin string, sb seededBug, seed uint64) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sb.duration+3*time.Minute)
	defer cancel()
	dir := out(t)
	if *bugSeeds > 1 {
		dir = filepath.Join(dir, fmt.Sprintf("seed-%d", seed))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	o := chaos.Options{Manager: bin, Nodes: 3, Modules: 1, Seed: seed, Duration: sb.duration,
		Faults: []string{}, Aims: []chaos.Aim{sb.aim}, Bugs: []string{sb.bug}, StopOnViolation: true,
		ConvergeTimeout: 15 * time.Second, AimSettle: aimSettle, StopDelay: sb.stopDelay, OutDir: dir, Log: testWriter{t}}
	if *noFaults {
		o.Aims = nil
	}
	if *noBugs {
		o.Bugs = nil
	}
	if sb.lease != nil {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = sb.lease[0], sb.lease[1], sb.lease[2]
	}
	t0 := time.Now()
	rep, err := chaos.Run(ctx, o)
	if rep == nil {
		t.Fatalf("no report: %v", err)
	}
	var b strings.Builder
	rep.Print(&b)
	t.Log("\n" + b.String())
	caught := false
	for _, v := range rep.Violations {
		caught = caught || strings.Contains(v, sb.caught)
	}
	switch {
	case *noBugs && len(rep.Violations) > 0:
		t.Fatalf("the fault aimed for %s broke an invariant of a manager without the bug: %v (logs in %s)", sb.bug, rep.Violations, dir)
	case *noBugs:
		t.Logf("control: the fault aimed for %s (fired %d times) broke nothing without the bug (%.0f s)", sb.bug, rep.Faults[sb.aim.Kind], time.Since(t0).Seconds())
	case *noFaults && caught:
		t.Fatalf("the seeded bug %s was caught without its fault: the fault is not what exposes it (logs in %s)", sb.bug, dir)
	case *noFaults:
		t.Logf("control: %s not caught without its fault (%d violations, %.0f s)", sb.bug, len(rep.Violations), time.Since(t0).Seconds())
	case !caught:
		t.Logf("seed %d: the watcher did not catch the seeded bug %s (no violation mentioning %q; aim %s fired %d times; run error: %v; logs in %s)",
			seed, sb.bug, sb.caught, sb.aim, rep.Faults[sb.aim.Kind], err, dir)
		return false
	default:
		t.Logf("caught %s in %.0f s (whole run, control plane included)", sb.bug, time.Since(t0).Seconds())
	}
	return true
}
