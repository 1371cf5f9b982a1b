package fsm

import "github.com/kmm-project/kmm/contract"

// deriveFuncs say, per state, which trigger the facts amount to (false: none). They implement the
// five rules of seed 000, reboot detection and the ordered upgrade, one state at a time. Events
// about the worker pod are taken whatever the node's state (seed 000 reads finished pods first);
// every other trigger needs a Ready, schedulable node (rule 1).
var deriveFuncs = map[State]func(*Facts) (Trigger, bool){
	Absent:               deriveAbsent,
	Loading:              deriveLoading,
	LoadBackOff:          deriveLoadBackOff,
	Loaded:               deriveLoaded,
	DevicePluginDraining: deriveDevicePluginDraining,
	Unloading:            deriveUnloading,
	UnloadBackOff:        deriveUnloadBackOff,
	Upgrading:            deriveUpgrading,
}

// derive returns the trigger the facts amount to in the pair's current state.
func derive(f *Facts) (Trigger, bool) {
	return deriveFuncs[f.state()](f)
}

// deriveAbsent: a record upstream KMM left that kmm's spec wants in this boot is adopted; a record
// of a config that may still be in the kernel with no spec entry wanting it is unloaded, like any
// entry removal (upstream's record of a Module deleted, or of a node no longer selected, before
// the takeover); else rule 2, status missing and the node runs the spec's kernel → load.
func deriveAbsent(f *Facts) (Trigger, bool) {
	switch {
	case f.adoptable():
		return Adopted, true
	case f.strandedLoad():
		return SpecRemoved, f.nodeUsable()
	}
	return SpecSet, f.nodeUsable() && f.specKernelMatches()
}

func deriveLoading(f *Facts) (Trigger, bool) {
	if f.currentLoader() && f.workerFinished() {
		return loaderFinished(f)
	}
	if f.currentLoader() && f.workerOverdue() {
		return WorkerTimedOut, true
	}
	if f.Worker.Phase == PodRunning || !f.nodeUsable() {
		return "", false
	}
	if f.Status.Config != nil && f.rebootedByBootID() {
		return NodeRebooted, true // the config kept from before is certainly not loaded any more
	}
	if t, ok := unloadFirst(f); ok {
		return t, true
	}
	if t, ok := specWithdrawn(f); ok {
		return t, true
	}
	// The spec is for this kernel: a config no worker can act on, a pod the API server refused, or a
	// service account kmm could not read fails the attempt without a pod.
	return WorkerRejected, f.specProblem() != nil || f.refused(contract.ActionLoad) || f.refused(contract.ActionReload)
}

// loaderFinished is the outcome of the current load (or reload) pod, which finished.
func loaderFinished(f *Facts) (Trigger, bool) {
	switch {
	case f.loadedByFailedHook():
		return HookFailed, true
	case f.Worker.Phase == PodFailed:
		return WorkerFailed, true
	}
	// A success reported in another boot is stale: the module is not loaded in this one.
	return WorkerSucceeded, f.Worker.Result.BootID == "" || f.Worker.Result.BootID == f.Node.BootID
}

// unloadFirst is rule 4 for a pair that may still have an old config loaded (a reload after a
// Ready flap keeps the record): a different or removed spec unloads it before anything loads,
// unless one reload worker may do both (reloadable).
func unloadFirst(f *Facts) (Trigger, bool) {
	if !f.needsUnload() || !f.statusKernelMatches() || f.reloadable() {
		return "", false
	}
	if f.Spec == nil {
		return SpecRemoved, true
	}
	return SpecChanged, true
}

// specWithdrawn reports that no load can happen: no spec entry, or not for this kernel.
func specWithdrawn(f *Facts) (Trigger, bool) {
	switch {
	case f.Spec == nil:
		return SpecRemoved, true
	case !f.specKernelMatches():
		return KernelChanged, true
	}
	return "", false
}

func deriveLoadBackOff(f *Facts) (Trigger, bool) {
	if f.lateSuccess(contract.ActionLoad) {
		return WorkerSucceeded, true // the pod timed out, then finished after all: the module is loaded
	}
	if f.lateReloadUnloaded() {
		return WorkerFailed, true // a timed-out reload unloaded the old config after all, then failed
	}
	if f.lateHookLoaded() {
		return WorkerFailed, true // a timed-out load loaded after all, then its postLoad hook failed
	}
	if !f.nodeUsable() {
		return "", false
	}
	if t, ok := unloadFirst(f); ok {
		return t, true
	}
	if t, ok := specWithdrawn(f); ok {
		return t, true
	}
	if f.failedConfigReplaced() {
		return SpecChanged, true // the failed config was replaced: retry at once
	}
	// Whatever the worker said, the same config is retried only after the back-off, and never
	// when it was refused as invalid.
	return BackOffExpired, !f.failureTerminal() && f.backOffExpired()
}

// deriveLoaded: reboots (bootID, or rule 5's Ready timestamp), rule 4's unload when the spec
// differs from status on the status kernel, and upgrade requests.
func deriveLoaded(f *Facts) (Trigger, bool) {
	if !f.nodeUsable() {
		return "", false
	}
	switch {
	case f.rebootedByBootID() || (f.Status.Config != nil && !f.statusKernelMatches()):
		return NodeRebooted, true
	case f.needsUnload():
		if f.Spec == nil {
			return SpecRemoved, true
		}
		return SpecChanged, true
	case f.upgradeRequested():
		return UpgradeRequested, true
	case f.readyNewerThanWorker():
		return NodeRebooted, true
	}
	return "", false
}

// unloadOverruled is what ends an unload before it completes: a reboot unloaded everything, or the
// spec came back to the loaded config with no upgrade requested.
func unloadOverruled(f *Facts) (Trigger, bool) {
	switch {
	case f.rebootedByBootID():
		return NodeRebooted, true
	case !f.needsUnload() && !f.upgradeRequested():
		return SpecRestored, true
	}
	return "", false
}

func deriveDevicePluginDraining(f *Facts) (Trigger, bool) {
	if !f.nodeUsable() {
		return "", false
	}
	if t, ok := unloadOverruled(f); ok {
		return t, true
	}
	if t, ok := jobWaitTrigger(f); ok {
		return t, true
	}
	if len(f.Claims) > 0 {
		// Said once per wait (the status reason then names it), with the claims in its message.
		return ClaimsAllocated, f.Status.Reason != string(ClaimsAllocated)
	}
	return DevicePluginGone, f.needsUnload() && !f.DevicePluginRunning && len(f.remainingWorkloads()) == 0
}

func deriveUnloading(f *Facts) (Trigger, bool) {
	if f.currentWorker(contract.ActionUnload) && f.workerFinished() {
		if f.Worker.Phase == PodFailed && f.Worker.Result.Reason == ReasonPreUnloadHookFailed {
			return HookFailed, true
		}
		if f.Worker.Phase == PodFailed {
			return WorkerFailed, true
		}
		return WorkerSucceeded, true
	}
	if f.currentWorker(contract.ActionUnload) && f.workerOverdue() {
		return WorkerTimedOut, true
	}
	if f.Worker.Phase == PodRunning || !f.nodeUsable() {
		return "", false
	}
	if t, ok := unloadOverruled(f); ok {
		return t, true
	}
	return WorkerRejected, f.refused(contract.ActionUnload)
}

func deriveUnloadBackOff(f *Facts) (Trigger, bool) {
	if f.lateSuccess(contract.ActionUnload) {
		// The pod timed out, then finished after all: the module is unloaded, whatever the spec
		// says now (a spec back at the old config must load it again, not call it Loaded).
		return WorkerSucceeded, true
	}
	if !f.nodeUsable() {
		return "", false
	}
	if t, ok := unloadOverruled(f); ok {
		return t, true
	}
	return BackOffExpired, f.backOffExpired()
}

func deriveUpgrading(f *Facts) (Trigger, bool) {
	if !f.nodeUsable() {
		return "", false
	}
	switch {
	case f.specKernelMatches():
		return SpecSet, true
	case f.Node.UpgradeTarget == "" || f.specOverdue():
		// No version requested, or the worker may load the target and still no entry for the
		// node's kernel came: no mapping for this kernel (the entry for the kernel the node ran
		// before is kept, and the node may have rebooted into another one mid-upgrade), or the
		// Module is at another version. Absent lifts kmm's cordon; an entry that comes later loads.
		return UpgradeAbandoned, true
	}
	return "", false
}
