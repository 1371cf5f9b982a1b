package fsm

import (
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/semantic"
)

// Facts is everything the NMC decision knows about one (node, module) pair, gathered by the
// reconciler before deciding. Time is a fact too.
type Facts struct {
	// Now is the time of the decision.
	Now time.Time
	// Spec is the pair's NMC spec entry, nil when there is none.
	Spec *kmmv1beta1.NodeModuleSpec
	// Status is the pair's NMC status entry; the zero value (empty State) means a new pair.
	Status kmmv1beta1.NodeModuleStatus
	// Node is what the node reports.
	Node Node
	// Worker is the pair's worker pod, if any.
	Worker Worker
	// DevicePluginRunning says whether a device plugin pod of the module exists on the node.
	DevicePluginRunning bool
	// BackOff is the retry policy after worker failures.
	BackOff BackOff
	// Drain is the upgrade drain of the workloads that use the module.
	Drain DrainFacts
}

// Node is what the NMC decision reads of a node.
type Node struct {
	// Ready is the node's Ready condition.
	Ready bool
	// Schedulable is false when the node is cordoned (unless by this operator's own upgrade drain).
	Schedulable bool
	// KernelVersion is node.status.nodeInfo.kernelVersion.
	KernelVersion string
	// BootID is node.status.nodeInfo.bootID.
	BootID string
	// ReadySince is the last transition time of the Ready condition.
	ReadySince time.Time
	// UpgradeTarget is the value of the module's version-module label, "" when absent or when the
	// Module no longer exists (a deleted Module has nothing to upgrade to).
	UpgradeTarget string
	// WorkerPodVersion is the value of the module's version-worker-pod label, "" when absent.
	WorkerPodVersion string
}

// WorkerPhase is what became of a worker pod.
type WorkerPhase string

// The worker pod phases the decision distinguishes.
const (
	PodNone      WorkerPhase = ""
	PodRunning   WorkerPhase = "Running"
	PodSucceeded WorkerPhase = "Succeeded"
	PodFailed    WorkerPhase = "Failed"
)

// WorkerAction is what a worker pod does.
type WorkerAction string

// The worker actions.
const (
	ActionLoad   WorkerAction = "load"
	ActionUnload WorkerAction = "unload"
)

// Worker is the pair's worker pod as observed (at most one exists: its name is deterministic).
type Worker struct {
	Phase  WorkerPhase
	Action WorkerAction
	// Attempt is the status Attempts value the pod was created for; a pod of another attempt is stale.
	Attempt int32
	// Entry is what the pod was created to load or unload.
	Entry kmmv1beta1.NodeModuleSpec
	// Result is what the worker reported, for a finished pod.
	Result WorkerResult
}

// WorkerResult is the part of the worker's report the decision uses.
type WorkerResult struct {
	BootID      string
	ImageDigest string
	Reason      string
	Message     string
}

// BackOff is an exponential back-off: Base after the first failure, doubling up to Max.
type BackOff struct {
	Base time.Duration
	Max  time.Duration
}

// DefaultBackOff is the retry policy of the operator.
var DefaultBackOff = BackOff{Base: 10 * time.Second, Max: 5 * time.Minute}

// Delay is how long to wait after the given number of consecutive failures.
func (b BackOff) Delay(attempts int32) time.Duration {
	d := b.Base
	for i := int32(1); i < attempts && d < b.Max; i++ {
		d *= 2
	}
	return min(d, b.Max)
}

// state is the stored state, Absent for a new pair.
func (f *Facts) state() State {
	if f.Status.State == "" {
		return Absent
	}
	return f.Status.State
}

// nodeUsable is rule 1 of seed 000; a node this pair's own drain cordoned counts as schedulable.
func (f *Facts) nodeUsable() bool {
	ownCordon := f.Status.Drain != nil && f.Status.Drain.CordonedByKMM
	return f.Node.Ready && (f.Node.Schedulable || ownCordon)
}

func (f *Facts) specKernelMatches() bool {
	return f.Spec != nil && f.Spec.Config.KernelVersion == f.Node.KernelVersion
}

func (f *Facts) statusKernelMatches() bool {
	return f.Status.Config != nil && f.Status.Config.KernelVersion == f.Node.KernelVersion
}

// needsUnload says whether the loaded config is no longer wanted as it is.
func (f *Facts) needsUnload() bool {
	return f.Status.Config != nil && (f.Spec == nil || !semantic.Equal(&f.Spec.Config, f.Status.Config))
}

// rebootedByBootID says whether the node booted since the config was loaded.
func (f *Facts) rebootedByBootID() bool {
	return f.Status.BootID != "" && f.Node.BootID != "" && f.Status.BootID != f.Node.BootID
}

// readyNewerThanWorker is seed 000's rule 5: a Ready transition after the last worker run.
func (f *Facts) readyNewerThanWorker() bool {
	return f.Status.LastWorkerTime != nil && f.Node.ReadySince.After(f.Status.LastWorkerTime.Time)
}

func (f *Facts) loadedVersion() string {
	if f.Status.Config == nil {
		return ""
	}
	return f.Status.Config.Version
}

// upgradeRequested says whether the node's version-module label asks for another loaded version.
func (f *Facts) upgradeRequested() bool {
	v := f.loadedVersion()
	return v != "" && f.Node.UpgradeTarget != "" && f.Node.UpgradeTarget != v
}

// upgradeInProgress says whether an unload is part of an ordered upgrade to another version.
func (f *Facts) upgradeInProgress() bool {
	return f.Node.UpgradeTarget != "" && f.Node.UpgradeTarget != f.loadedVersion()
}

// currentWorker says whether the worker pod belongs to the pair's current attempt at action a.
func (f *Facts) currentWorker(a WorkerAction) bool {
	return f.Worker.Phase != PodNone && f.Worker.Action == a && f.Worker.Attempt == f.Status.Attempts
}

func (f *Facts) workerFinished() bool {
	return f.Worker.Phase == PodSucceeded || f.Worker.Phase == PodFailed
}

// UpgradeSpecGrace is how long an Upgrading pair waits for the new version's spec entry after the
// worker-pod label allows it; the Module→NMC controller writes it within moments when it can.
const UpgradeSpecGrace = 30 * time.Second

// specOverdue says whether the worker-pod label is at the target and the spec entry is still
// missing after UpgradeSpecGrace.
func (f *Facts) specOverdue() bool {
	return f.Node.WorkerPodVersion == f.Node.UpgradeTarget && !f.Now.Before(f.Status.LastTransitionTime.Add(UpgradeSpecGrace))
}

func (f *Facts) backOffExpired() bool {
	return !f.Now.Before(f.Status.LastTransitionTime.Add(f.BackOff.Delay(f.Status.Attempts)))
}
