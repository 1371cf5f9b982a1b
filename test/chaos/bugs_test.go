//go:build chaos

package chaos_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kmm-project/kmm/internal/chaosbug"
	"github.com/kmm-project/kmm/test/chaos"
)

// seededBug is one seeded bug, the faults that expose it, and the invariant whose violation
// proves the watcher caught it.
type seededBug struct {
	bug       string
	faults    []string
	intervals map[string]time.Duration
	proxy     chaos.ProxyFaults
	duration  time.Duration
	// caught is a piece of the violation text that must appear.
	caught string
}

var seededBugs = []seededBug{
	{
		// A kill between kmm's cordon and its uncordon: the next process does not lift it, the
		// rollout (maxUnavailable 1) stalls behind the cordoned node.
		bug: chaosbug.ForgetCordon, faults: []string{chaos.FaultKill},
		intervals: map[string]time.Duration{chaos.FaultKill: 700 * time.Millisecond}, duration: 40 * time.Second,
		caught: "cordoned",
	},
	{
		// The partitioned leader keeps leading once the partition ends.
		bug: chaosbug.KeepLeading, faults: []string{chaos.FaultPartition}, duration: 90 * time.Second,
		caught: "held the Lease",
	},
	{
		// A 500 on the drain's pod list taken as "no pods": the unload runs under the workload.
		bug: chaosbug.ErrorAsNoPods, faults: []string{chaos.FaultServerError},
		proxy: chaos.ProxyFaults{ServerError: 0.2}, duration: 90 * time.Second,
		caught: "workload pod using it",
	},
}

// TestSeededBugs runs, for each seeded bug of internal/chaosbug, a manager built with it under the
// fault kind that exposes it, and checks that the watcher reports the violation it causes (the
// default run, TestChaos, is the same harness without the bugs: no violation).
func TestSeededBugs(t *testing.T) {
	bin := buildManager(t, "chaosbugs")
	for _, sb := range seededBugs {
		t.Run(sb.bug, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), sb.duration+3*time.Minute)
			defer cancel()
			dir := out(t)
			rep, err := chaos.Run(ctx, chaos.Options{Manager: bin, Nodes: 3, Modules: 1, Seed: *seed, Duration: sb.duration,
				Faults: sb.faults, Intervals: sb.intervals, Proxy: sb.proxy, Bugs: []string{sb.bug}, StopOnViolation: true,
				ConvergeTimeout: 20 * time.Second, OutDir: dir, Log: testWriter{t}})
			if rep == nil {
				t.Fatalf("no report: %v", err)
			}
			var b strings.Builder
			rep.Print(&b)
			t.Log("\n" + b.String())
			for _, v := range rep.Violations {
				if strings.Contains(v, sb.caught) {
					return
				}
			}
			t.Fatalf("the watcher did not catch the seeded bug %s (no violation mentioning %q; run error: %v; logs in %s)", sb.bug, sb.caught, err, dir)
		})
	}
}
