package fsm

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/semantic"
	"github.com/kmm-project/kmm/internal/validation"
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
	// DevicePluginConfigured says whether the Module has a device plugin or a DRA driver (its
	// DaemonSet selects nodes by the ready label); a reload then takes the ready label off like an
	// unload. A DRA driver pod counts in DevicePluginRunning as a device plugin pod does.
	DevicePluginConfigured bool
	// Claims are the ResourceClaims ("<namespace>/<name>", sorted, at most MaxClaimsListed)
	// allocated on the node with devices of the Module's DRA driver; nil for a Module without
	// spec.dra. While there is one, the module is not unloaded and its driver stays (the kubelet
	// needs it to unprepare the claims).
	Claims []string
	// BackOff is the retry policy after worker failures.
	BackOff BackOff
	// Drain is the upgrade drain of the workloads that use the module.
	Drain DrainFacts
	// WorkerTimeout is how long a worker pod may exist without finishing; 0 means DefaultWorkerTimeout.
	WorkerTimeout time.Duration
	// CreateRefused is the API server's refusal of the pair's last worker pod, nil when none is
	// known (the reconciler remembers it until a pod of the pair exists again).
	CreateRefused *CreateRefusal
	// UpstreamWorkerPresent says a worker pod upstream KMM created for the pair is still on the node
	// (see adopt.go): a record upstream left waits for it.
	UpstreamWorkerPresent bool
	// SpecWrittenByKMM says kmm's Module→NMC controller wrote the pair's spec entry (its field
	// manager owns it); an entry upstream KMM left is not kmm's decision yet.
	SpecWrittenByKMM bool

	// fromUpstream is set by Step: the status entry was an upstream record when the step began.
	fromUpstream bool
}

// CreateRefusal is a worker pod the API server would not create (invalid, forbidden, too large), or
// one the operator could not make (its service account unreadable): retrying at once cannot help,
// so the pair backs off like after a failed worker.
type CreateRefusal struct {
	Action  contract.Action
	Attempt int32
	// Reason is the status reason of the failed attempt: "" for ReasonPodRejected (the API server
	// refused the pod; Message quotes it), else the operator's own class, such as
	// ReasonServiceAccountUnreadable (Message says what failed).
	Reason  string
	Message string
}

// MaxClaimsListed bounds Facts.Claims: the reconciler keeps the first names, sorted, and a
// longer list says only that there are more.
const MaxClaimsListed = 8

// DefaultWorkerTimeout bounds a worker pod's life: the worker gives up after its own deadline (4
// minutes), the pod's activeDeadlineSeconds stops it a minute later, and this catches pods that
// neither reached (never started, or a kubelet that does not report).
const DefaultWorkerTimeout = 7 * time.Minute

// Failure classes the operator itself gives (the worker's own are contract.Reason's: ImagePull,
// NotFound, Busy, InvalidConfig and Other).
const (
	// ReasonInvalidConfig: the config is one the worker cannot act on; the pair waits for a new one.
	ReasonInvalidConfig = string(contract.ReasonInvalidConfig)
	// ReasonPodRejected: the API server refused the worker pod.
	ReasonPodRejected = "PodRejected"
	// ReasonServiceAccountUnreadable: the operator could not read the service account of the
	// worker pod for its imagePullSecrets, so it made no pod (CreateRefusal.Reason).
	ReasonServiceAccountUnreadable = "ServiceAccountUnreadable"
	// ReasonTimedOut: the worker pod did not finish within the worker timeout.
	ReasonTimedOut = "TimedOut"
	// ReasonPostLoadHookFailed: the worker loaded the module and the Module's postLoad hook then
	// failed; the module is loaded (the record says so) and the pair backs off, then runs the load
	// pod, hook included, again.
	ReasonPostLoadHookFailed = "PostLoadHookFailed"
	// ReasonPreUnloadHookFailed: the Module's preUnload hook failed, so the unload worker never
	// ran; the module stays loaded and the pair backs off, then tries the hook again.
	ReasonPreUnloadHookFailed = "PreUnloadHookFailed"
)

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

// Worker is the pair's worker pod as observed (at most one exists: its name is deterministic).
type Worker struct {
	Phase  WorkerPhase
	Action contract.Action
	// Attempt is the status Attempts value the pod was created for; a pod of another attempt is stale.
	Attempt int32
	// Entry is what the pod was created to load or unload.
	Entry kmmv1beta1.NodeModuleSpec
	// EntryKnown says whether Entry could be read from the pod; a pod whose entry is unknown never
	// counts as "the failed config was replaced".
	EntryKnown bool
	// Created is when the pod was created.
	Created time.Time
	// Result is what the worker reported, for a finished pod (the worker's own report: one
	// vocabulary of actions, reasons and reload steps for the worker and the decision).
	Result contract.Result
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

// strandedLoad says whether an Absent pair's record names a config that may still be in the
// node's kernel (recorded for the kernel it runs, in this boot or with no boot recorded) while no
// spec entry wants it: nothing but an unload takes it out. Dropping such a record left the module
// loaded with no record of it (issue 18: upstream KMM's record of a Module deleted before the
// takeover).
func (f *Facts) strandedLoad() bool {
	return f.state() == Absent && f.Spec == nil && f.statusKernelMatches() && !f.rebootedByBootID()
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

// reloadable (a Module without hooks: a hooked one runs its preUnload and postLoad hooks around
// separate unload and load pods) says whether the loaded config may be replaced by the spec's in one worker run that
// unloads the one and loads the other (an image bump): both are for the node's kernel, neither is
// versioned (an ordered upgrade keeps seed 002's flow), nothing is to be drained between them (no
// device plugin pod of the module on the node, no workload an upgrade drain selects), the spec's
// config is one a worker can act on, and the pod settings (service account, pull secret,
// tolerations) are the same, so that one pod serves both halves.
func (f *Facts) reloadable() bool {
	s, st := f.Spec, &f.Status
	if s == nil || !f.needsUnload() || !f.specKernelMatches() || !f.statusKernelMatches() {
		return false
	}
	return s.Config.Version == "" && st.Config.Version == "" && !f.upgradeRequested() && s.Hooks == nil && st.Hooks == nil &&
		f.nothingBetweenUnloadAndLoad() && f.specProblem() == nil && f.samePodSettings()
}

// nothingBetweenUnloadAndLoad: no device plugin pod, workload or ResourceClaim must go between an
// unload and a load.
func (f *Facts) nothingBetweenUnloadAndLoad() bool {
	return !f.DevicePluginRunning && len(f.remainingWorkloads()) == 0 && len(f.Claims) == 0
}

// samePodSettings: the spec entry's pod settings are those recorded for the loaded config.
func (f *Facts) samePodSettings() bool {
	s, st := f.Spec, &f.Status
	return s.ServiceAccountName == st.ServiceAccountName && semantic.Equal(s.ImageRepoSecret, st.ImageRepoSecret) &&
		sameTolerations(s.Tolerations, st.Tolerations)
}

// loadedByFailedHook says whether the pair's failed worker pod loaded its config in this boot and
// then failed on its postLoad hook: the module is in the kernel.
func (f *Facts) loadedByFailedHook() bool {
	r := f.Worker.Result
	return f.Worker.Phase == PodFailed && r.Reason == ReasonPostLoadHookFailed && f.Worker.Action == contract.ActionLoad &&
		(r.BootID == "" || r.BootID == f.Node.BootID)
}

// lateHookLoaded says whether the load pod whose time-out the status counts last ended after all,
// having loaded the config and failed on its postLoad hook, while the record names nothing loaded.
func (f *Facts) lateHookLoaded() bool {
	return f.Status.Reason == ReasonTimedOut && f.Status.Config == nil && f.Worker.Attempt == f.Status.Attempts-1 &&
		f.loadedByFailedHook()
}

// sameTolerations compares the spec's tolerations with those recorded from the admitted pod,
// leaving out the two the API server adds to every pod (DefaultTolerationSeconds).
func sameTolerations(spec, recorded []corev1.Toleration) bool {
	var kept []corev1.Toleration
	for _, t := range recorded {
		if (t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable) && t.Effect == corev1.TaintEffectNoExecute &&
			!slices.ContainsFunc(spec, func(s corev1.Toleration) bool { return s.Key == t.Key }) {
			continue
		}
		kept = append(kept, t)
	}
	return len(spec) == len(kept) && (len(kept) == 0 || semantic.Equal(&spec, &kept))
}

// loadAction is the worker a Loading pair runs: a reload when the loaded config may be replaced in
// one run, else a load.
func (f *Facts) loadAction() contract.Action {
	if f.reloadable() {
		return contract.ActionReload
	}
	return contract.ActionLoad
}

// currentLoader says whether the worker pod is the current attempt at loading: a load, or a reload
// while a previous config is recorded (a reboot clears the record and the attempts: a reload pod of
// before it is stale, found by the rapid model).
func (f *Facts) currentLoader() bool {
	return f.currentWorker(contract.ActionLoad) || (f.currentWorker(contract.ActionReload) && f.Status.Config != nil)
}

// reloadKeptPrevious says whether the pair's failed worker is a reload that stopped before its
// unload half succeeded (or whose half is unknown: a pod that ended without a result): the
// previous config is (or may be) still loaded.
func (f *Facts) reloadKeptPrevious() bool {
	return f.Worker.Action == contract.ActionReload && f.Worker.Result.FailedStep != contract.StepLoad && f.Status.Config != nil
}

// reloadUnloadedPrevious says whether the pair's failed worker is a reload that unloaded the
// previous config and failed to load the new one: nothing is loaded.
func (f *Facts) reloadUnloadedPrevious() bool {
	return f.Worker.Action == contract.ActionReload && f.Worker.Phase == PodFailed && f.Worker.Result.FailedStep == contract.StepLoad
}

// currentWorker says whether the worker pod belongs to the pair's current attempt at action a.
func (f *Facts) currentWorker(a contract.Action) bool {
	return f.Worker.Phase != PodNone && f.Worker.Action == a && f.Worker.Attempt == f.Status.Attempts
}

func (f *Facts) workerFinished() bool {
	return f.Worker.Phase == PodSucceeded || f.Worker.Phase == PodFailed
}

// UpgradeSpecGrace is how long an Upgrading pair waits for the new version's spec entry after the
// worker-pod label allows it; the Module→NMC controller writes it within moments when it can.
const UpgradeSpecGrace = 30 * time.Second

// specOverdue says whether the worker-pod label is at the target and, UpgradeSpecGrace after the
// pair entered its state, the spec still has no entry the worker could load on the node's kernel
// (the caller checked that).
func (f *Facts) specOverdue() bool {
	return f.Node.WorkerPodVersion == f.Node.UpgradeTarget && !f.Now.Before(f.Status.LastTransitionTime.Add(UpgradeSpecGrace))
}

// workerTimeout is the worker timeout with its default.
func (f *Facts) workerTimeout() time.Duration {
	if f.WorkerTimeout > 0 {
		return f.WorkerTimeout
	}
	return DefaultWorkerTimeout
}

// workerOverdue says whether a pod of the pair still runs past the worker timeout.
func (f *Facts) workerOverdue() bool {
	return f.Worker.Phase == PodRunning && !f.Worker.Created.IsZero() && !f.Now.Before(f.Worker.Created.Add(f.workerTimeout()))
}

// refused says whether the API server refused the pod of the pair's current attempt at action a.
func (f *Facts) refused(a contract.Action) bool {
	r := f.CreateRefused
	return r != nil && r.Action == a && r.Attempt == f.Status.Attempts
}

// specProblem is why the spec entry's config cannot be given to a worker (nil when it can).
func (f *Facts) specProblem() error {
	if f.Spec == nil {
		return nil
	}
	return validation.ModuleConfig(&f.Spec.Config)
}

// failedConfigReplaced says whether the config that failed was replaced by another that may work:
// known from the pod of the last failed attempt, or, after a refused config with no such pod to
// compare, from the spec being valid now. A pod whose entry cannot be read never counts (that was
// a retry storm of issue 13).
func (f *Facts) failedConfigReplaced() bool {
	if f.Spec == nil {
		return false
	}
	if f.failedPodOfLastAttempt() {
		return f.Worker.EntryKnown && !sameEntry(f.Worker.Entry, *f.Spec)
	}
	return f.Status.Reason == ReasonInvalidConfig && f.specProblem() == nil
}

// failedPodOfLastAttempt says whether the worker pod is the one whose failure the status counts
// last; an older pod says nothing about the config that failed last.
func (f *Facts) failedPodOfLastAttempt() bool {
	return f.Worker.Phase == PodFailed && f.Worker.Attempt == f.Status.Attempts-1
}

// lateSuccess says whether the pod of action a whose time-out the status counts last succeeded
// after all (a load in this boot; an unload in any: a reboot unloads too): the deletion of an
// overdue pod loses the race with its own success.
func (f *Facts) lateSuccess(a contract.Action) bool {
	thisBoot := f.Worker.Result.BootID == "" || f.Worker.Result.BootID == f.Node.BootID
	sameAction := f.Worker.Action == a || (a == contract.ActionLoad && f.Worker.Action == contract.ActionReload)
	return f.Status.Reason == ReasonTimedOut && f.Worker.Phase == PodSucceeded && sameAction &&
		f.Worker.Attempt == f.Status.Attempts-1 && (a == contract.ActionUnload || thisBoot)
}

// lateReloadUnloaded says whether the reload pod whose time-out the status counts last ended after
// all, having unloaded the previous config and failed to load the new one, while the record still
// names the previous config (found by the explorer: the record then said Loaded with nothing in
// the kernel once the spec went back to the old config).
func (f *Facts) lateReloadUnloaded() bool {
	return f.Status.Reason == ReasonTimedOut && f.Status.Config != nil && f.Worker.Attempt == f.Status.Attempts-1 &&
		f.reloadUnloadedPrevious()
}

// failureTerminal says whether the last failure cannot be retried with the same config (the
// worker's reason class decides, contract.Reason.Terminal; the operator's own refusal of a config
// records the same InvalidConfig).
func (f *Facts) failureTerminal() bool {
	return contract.Reason(f.Status.Reason).Terminal()
}

func (f *Facts) backOffExpired() bool {
	return !f.Now.Before(f.Status.LastTransitionTime.Add(f.BackOff.Delay(f.Status.Attempts)))
}
