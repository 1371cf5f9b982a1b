package upgrade

import (
	"testing"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestDrainTimedOutWaitsForJobs: with drain.jobs, a node's drain counts as DrainTimedOut only once
// the Job wait and the strategies after it have run (as fsm's planDrain says TimedOut).
func TestDrainTimedOutWaitsForJobs(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n := &RolloutNode{State: kmmv1beta1.StateDevicePluginDraining, DrainStart: start}
	d := &kmmv1beta1.DrainSpec{TimeoutSeconds: 60, PDBForceDrainTimeoutSeconds: 300}
	if n.drainTimedOut(d, start.Add(299*time.Second)) || !n.drainTimedOut(d, start.Add(300*time.Second)) {
		t.Fatal("without jobs the drain times out 300 s after it started")
	}
	d.Jobs = &kmmv1beta1.DrainJobs{WaitSeconds: 600}
	if n.drainTimedOut(d, start.Add(899*time.Second)) || !n.drainTimedOut(d, start.Add(900*time.Second)) {
		t.Fatal("with jobs.waitSeconds 600 the drain times out 900 s after it started")
	}
}
