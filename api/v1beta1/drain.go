package v1beta1

import "time"

// Values of DrainStatus.JobWait.
const (
	// JobWaitWaiting: the drain said it waits for Job pods.
	JobWaitWaiting = "Waiting"
	// JobWaitExpired: the drain said the wait for Job pods is over.
	JobWaitExpired = "Expired"
)

// JobWait is how long the drain waits for Job pods before it drains them (0: jobs not set, or
// waitSeconds not defaulted).
func (d *DrainSpec) JobWait() time.Duration {
	if d == nil || d.Jobs == nil {
		return 0
	}
	return time.Duration(d.Jobs.WaitSeconds) * time.Second
}

// GiveUp is how long after its start a drain has run every strategy on every pod, Job pods
// included (their strategies start jobs.waitSeconds later): pods left then make it a timed-out
// drain (kmm_node_drain_timeout, and an automatic rollout's DrainTimedOut).
func (d *DrainSpec) GiveUp() time.Duration {
	escalation := time.Duration(max(d.TimeoutSeconds, d.ExpectedDrainSeconds+d.PDBForceDrainTimeoutSeconds)) * time.Second
	return d.JobWait() + escalation
}
