//go:build chaos

package chaos_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kmm-project/kmm/test/chaos"
	"github.com/kmm-project/kmm/test/envtest"
)

var (
	duration    = flag.Duration("chaos.duration", 7*time.Minute, "how long faults are injected")
	seed        = flag.Uint64("chaos.seed", 1, "seed of the fault points")
	nodes       = flag.Int("chaos.nodes", 4, "simulated nodes")
	modules     = flag.Int("chaos.modules", 1, "Modules")
	apiServers  = flag.Int("chaos.apiservers", 4, "kube-apiserver instances behind the balancer (1: a single one, no balancer)")
	outDir      = flag.String("chaos.out", "", "directory for the logs and report.json (default: a temporary one)")
	minFaults   = flag.String("chaos.min-faults", "", "minimum faults per kind, kind=n,... (default: defaultMinimums)")
	lease       = flag.String("chaos.lease", "2s/1s/150ms", "the replicas' lease duration (whole seconds: the Lease records seconds), renew deadline and retry period")
	intervals   = flag.String("chaos.intervals", "partition=100ms,apiserver-restart=500ms,manager-kill=2500ms", "mean waits between faults of a kind, kind=duration,... (default: defaultIntervals)")
	shares      = flag.String("chaos.shares", "http-429=0.1,http-500=0.1,http-409=0.5,delay=0.4", "request fault shares, kind=share,...")
	window      = flag.Duration("chaos.phase-window", 30*time.Second, "longest a phase is faulted before the faults pause until it converged (0: never pause)")
	leaderKill  = flag.Float64("chaos.leader-kills", 0.2, "share of manager kills aimed at the Lease holder ")
	steadyShare = flag.Float64("chaos.steady-share", 0.2, "share of the fault time with every fault but kills and partitions, in upgrade windows (the Lease stays put, so the leader's updates meet the request faults)")
	replicas    = flag.Int("chaos.replicas", 3, "manager replicas")
	faultWall   = flag.Duration("chaos.fault-wall", 12*time.Minute, "the longest the fault phase runs in wall time, pauses included, to reach -chaos.duration of faults and every minimum")
)

// defaultMinimums are the faults of each kind the default run must reach: issue 23's 100 of every
// kind. -chaos.min-faults asks for others.
var defaultMinimums = map[string]int{
	chaos.FaultKill: 100, chaos.FaultPartition: 100, chaos.FaultAPIServerRestart: 100, chaos.FaultEtcdRestart: 100,
	chaos.FaultWatchCut: 100, chaos.FaultThrottle: 100, chaos.FaultServerError: 100, chaos.FaultConflict: 100, chaos.FaultDelay: 100,
}

// The watcher's client-go watches log through controller-runtime's logger: discard it (the harness
// reports through t.Log).
func init() { ctrllog.SetLogger(logr.Discard()) }

// buildManager builds the manager command pkg (./cmd/manager, or the seeded bugs' one) into a
// temporary directory.
func buildManager(t *testing.T, pkg string) string {
	t.Helper()
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "manager")
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the operator: %v\n%s", err, out)
	}
	return bin
}

// out is the directory for a run's logs: under -chaos.out, or a temporary one that is removed
// only if the test passed (a failed run's logs are what explains it; the path is in the failure).
func out(t *testing.T) string {
	if *outDir == "" {
		dir, err := os.MkdirTemp("", "kmm-chaos-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !t.Failed() {
				_ = os.RemoveAll(dir)
			}
		})
		return dir
	}
	dir := filepath.Join(*outDir, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestChaos is the default run of `make chaos`: every fault kind, at least its minimum count, no
// violation, every pair converged after the last fault.
func TestChaos(t *testing.T) {
	bin := buildManager(t, "./cmd/manager")
	dir := out(t)
	o := chaos.Options{Manager: bin, Nodes: *nodes, Modules: *modules, APIServers: *apiServers, Seed: *seed, Duration: *duration,
		Minimums: minimums(t), FaultWall: *faultWall,
		Baseline: true, OutDir: dir, Log: testWriter{t}, LeaderKills: *leaderKill, PhaseWindow: *window, SteadyLeaderShare: *steadyShare, Replicas: *replicas}
	setTuning(t, &o)
	ctx, cancel := context.WithTimeout(context.Background(), chaos.MaxRunTime(o))
	defer cancel()
	if d, ok := t.Deadline(); ok && time.Until(d) < chaos.MaxRunTime(o) {
		t.Fatalf("go test's -timeout leaves %v, the run may take %v: raise -timeout or lower -chaos.fault-wall", time.Until(d).Round(time.Second), chaos.MaxRunTime(o))
	}
	rep, err := chaos.Run(ctx, o)
	if rep != nil {
		var b strings.Builder
		rep.Print(&b)
		t.Log("\n" + b.String())
		if data, jerr := json.MarshalIndent(rep, "", "  "); jerr == nil {
			_ = os.WriteFile(filepath.Join(dir, "report.json"), data, 0o644)
		}
	}
	if err != nil {
		t.Fatalf("%v (logs in %s)", err, dir)
	}
	if len(rep.Violations) > 0 {
		t.Errorf("%d invariant violations (seed %d, logs in %s)", len(rep.Violations), *seed, dir)
	}
	for kind, want := range minimums(t) {
		if got := rep.Faults[kind]; got < want {
			t.Errorf("%d faults of kind %s injected, want at least %d", got, kind, want)
		}
	}
}

// setTuning applies -chaos.lease, -chaos.intervals and -chaos.shares to o.
func setTuning(t *testing.T, o *chaos.Options) {
	t.Helper()
	if *lease != "" {
		var ds [3]time.Duration
		parts := strings.Split(*lease, "/")
		for i := range ds {
			var err error
			if len(parts) != 3 {
				t.Fatalf("-chaos.lease %q: want duration/deadline/retry", *lease)
			}
			if ds[i], err = time.ParseDuration(parts[i]); err != nil {
				t.Fatalf("-chaos.lease: %v", err)
			}
		}
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = ds[0], ds[1], ds[2]
	}
	for k, v := range keyValues(t, "-chaos.intervals", *intervals) {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("-chaos.intervals %s: %v", k, err)
		}
		if o.Intervals == nil {
			o.Intervals = map[string]time.Duration{}
		}
		o.Intervals[k] = d
	}
	o.Proxy = chaos.ProxyFaults{MaxDelay: 300 * time.Millisecond}
	for k, v := range keyValues(t, "-chaos.shares", *shares) {
		var x float64
		if _, err := fmt.Sscan(v, &x); err != nil {
			t.Fatalf("-chaos.shares %s: %v", k, err)
		}
		switch k {
		case chaos.FaultThrottle:
			o.Proxy.Throttle = x
		case chaos.FaultServerError:
			o.Proxy.ServerError = x
		case chaos.FaultConflict:
			o.Proxy.Conflict = x
		case chaos.FaultDelay:
			o.Proxy.Delay = x
		default:
			t.Fatalf("-chaos.shares: unknown kind %q", k)
		}
	}
}

// keyValues splits "k=v,k=v".
func keyValues(t *testing.T, flagName, s string) map[string]string {
	m := map[string]string{}
	if s == "" {
		return m
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("%s: %q is not kind=value", flagName, kv)
		}
		m[k] = v
	}
	return m
}

func minimums(t *testing.T) map[string]int {
	if *minFaults == "" {
		return defaultMinimums
	}
	m := map[string]int{}
	for k, v := range keyValues(t, "-chaos.min-faults", *minFaults) {
		var n int
		if _, err := fmt.Sscan(v, &n); err != nil {
			t.Fatalf("-chaos.min-faults %s: %v", k, err)
		}
		m[k] = n
	}
	return m
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
