package fsm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/qmuntal/stateless"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// State is the state of a (node, module) pair, as stored in the NMC status entry.
type State = kmmv1beta1.ModuleState

// The states, re-exported for readability of this package.
const (
	Absent               = kmmv1beta1.StateAbsent
	Loading              = kmmv1beta1.StateLoading
	Loaded               = kmmv1beta1.StateLoaded
	Unloading            = kmmv1beta1.StateUnloading
	DevicePluginDraining = kmmv1beta1.StateDevicePluginDraining
	Upgrading            = kmmv1beta1.StateUpgrading
	LoadBackOff          = kmmv1beta1.StateLoadBackOff
	UnloadBackOff        = kmmv1beta1.StateUnloadBackOff
)

// States lists every state, in the order the diagrams describe them.
var States = []State{Absent, Loading, Loaded, DevicePluginDraining, Unloading, Upgrading, LoadBackOff, UnloadBackOff}

// Trigger is an observed event that may move a pair to another state.
type Trigger string

// The triggers. Step derives them from facts; the machine decides where each leads.
const (
	// SpecSet: the spec has an entry for the pair, for the kernel the node runs.
	SpecSet Trigger = "SpecSet"
	// SpecChanged: the spec entry differs from the loaded config.
	SpecChanged Trigger = "SpecChanged"
	// SpecRemoved: the spec has no entry for the pair any more.
	SpecRemoved Trigger = "SpecRemoved"
	// SpecRestored: the spec entry equals the loaded config again and no upgrade is requested.
	SpecRestored Trigger = "SpecRestored"
	// KernelChanged: the node runs another kernel than the one the spec entry or the loaded config is for.
	KernelChanged Trigger = "KernelChanged"
	// NodeRebooted: the node's boot ID changed, or its Ready transition is newer than the last worker run.
	NodeRebooted Trigger = "NodeRebooted"
	// WorkerSucceeded: the pair's current worker pod finished successfully.
	WorkerSucceeded Trigger = "WorkerSucceeded"
	// WorkerFailed: the pair's current worker pod failed (or was evicted).
	WorkerFailed Trigger = "WorkerFailed"
	// HookFailed: the pair's current worker pod failed on one of the Module's hooks: its postLoad
	// hook after the load succeeded (the module is loaded), or its preUnload hook, before the
	// unload ran (the module stays loaded).
	HookFailed Trigger = "HookFailed"
	// WorkerTimedOut: the pair's current worker pod has not finished within the worker timeout
	// (a stalled registry, a kubelet that never starts it); the pod is deleted.
	WorkerTimedOut Trigger = "WorkerTimedOut"
	// WorkerRejected: no worker pod could be made for the current attempt: its config is one the
	// worker cannot act on (InvalidConfig), the API server refused the pod (PodRejected), or the
	// operator could not read the pod's service account for its pull secrets
	// (ServiceAccountUnreadable).
	WorkerRejected Trigger = "WorkerRejected"
	// BackOffExpired: the back-off after a failure is over.
	BackOffExpired Trigger = "BackOffExpired"
	// UpgradeRequested: the node's version-module label asks for another version than the loaded one.
	UpgradeRequested Trigger = "UpgradeRequested"
	// DevicePluginGone: no device plugin pod of the module runs on the node any more.
	DevicePluginGone Trigger = "DevicePluginGone"
	// UpgradeAbandoned: an upgrade waiting for the new version's spec entry cannot go on: no version
	// is requested any more, or the worker-pod label is at the target and still no entry exists.
	UpgradeAbandoned Trigger = "UpgradeAbandoned"
	// ClaimsAllocated: ResourceClaims allocated on the node with devices of the Module's DRA driver
	// hold an unload back (the pair stays in DevicePluginDraining, its driver with it, until they are
	// released).
	ClaimsAllocated Trigger = "ClaimsAllocated"
	// Adopted: upstream KMM recorded the spec's config as loaded on this kernel in this boot (a
	// takeover, docs/migration.md): kmm takes it as loaded, without a worker.
	Adopted Trigger = "Adopted"
)

// IsFailure says whether a trigger reports a failed attempt (it counts in attempts and is a
// Warning Event).
func IsFailure(t Trigger) bool {
	return t == WorkerFailed || t == WorkerTimedOut || t == WorkerRejected || t == HookFailed
}

// IsWarning says whether a trigger's Event is a Warning: a failure, or a drain's wait for Job pods
// that ran out (JobWaitExpired: the pods are drained though they did not end).
func IsWarning(t Trigger) bool {
	return IsFailure(t) || t == JobWaitExpired
}

// ErrNotPermitted is returned (wrapped) when a trigger is not permitted in the current state.
var ErrNotPermitted = errors.New("trigger not permitted")

// pairKey is the context key under which a Fire call carries its pair.
type pairKey struct{}

// pair is the external storage of one Fire call: the state and the facts the guards read.
type pair struct {
	state State
	facts *Facts
}

func pairFrom(ctx context.Context) *pair {
	return ctx.Value(pairKey{}).(*pair)
}

var (
	machineOnce sync.Once
	machine     *stateless.StateMachine
)

// Machine returns the configured state machine, built once and shared: each Fire call carries its
// own state and facts in its context, so concurrent pairs never share state.
func Machine() *stateless.StateMachine {
	machineOnce.Do(func() { machine = newMachine(Absent) })
	return machine
}

// newMachine builds a machine whose initial state (shown in diagrams) is initial.
func newMachine(initial State) *stateless.StateMachine {
	sm := stateless.NewStateMachineWithExternalStorage(
		func(ctx context.Context) (stateless.State, error) {
			if p, ok := ctx.Value(pairKey{}).(*pair); ok {
				return p.state, nil
			}
			return initial, nil
		},
		func(ctx context.Context, s stateless.State) error {
			pairFrom(ctx).state = s.(State)
			return nil
		},
		stateless.FiringImmediate,
	)
	sm.OnUnhandledTrigger(func(_ context.Context, state stateless.State, trigger stateless.Trigger, unmet []string) error {
		return fmt.Errorf("%w: %s in state %s (unmet guards %v)", ErrNotPermitted, trigger, state, unmet)
	})
	Configure(sm)
	return sm
}

// Configure declares every state and transition on sm. It is the single source of the machine:
// the controller, the tests and the diagram generator all use it.
func Configure(sm *stateless.StateMachine) {
	sm.Configure(Absent).
		Permit(SpecSet, Loading, nodeKernelMatchesSpec).
		Permit(Adopted, Loaded, upstreamRecordMatchesSpec).
		Permit(SpecRemoved, DevicePluginDraining, loadedHereWithDevicePlugin).
		Permit(SpecRemoved, Unloading, loadedHereWithoutDevicePlugin)

	sm.Configure(Loading).
		Permit(WorkerSucceeded, Loaded).
		Permit(WorkerFailed, LoadBackOff, previousNotLoaded).
		Permit(WorkerFailed, UnloadBackOff, reloadKeptPrevious).
		Permit(WorkerTimedOut, LoadBackOff).
		Permit(WorkerRejected, LoadBackOff).
		Permit(HookFailed, LoadBackOff).
		PermitReentry(NodeRebooted).
		Permit(SpecRemoved, Absent, nothingLoadedHere).
		Permit(SpecRemoved, DevicePluginDraining, loadedHereWithDevicePlugin).
		Permit(SpecRemoved, Unloading, loadedHereWithoutDevicePlugin).
		Permit(SpecChanged, DevicePluginDraining, loadedHereWithDevicePlugin).
		Permit(SpecChanged, Unloading, loadedHereWithoutDevicePlugin).
		Permit(KernelChanged, Absent, nothingLoadedHere)

	sm.Configure(LoadBackOff).
		Permit(BackOffExpired, Loading).
		Permit(WorkerSucceeded, Loaded).
		PermitReentry(WorkerFailed).
		Permit(SpecChanged, Loading, nothingLoadedHere).
		Permit(SpecChanged, DevicePluginDraining, loadedHereWithDevicePlugin).
		Permit(SpecChanged, Unloading, loadedHereWithoutDevicePlugin).
		Permit(SpecRemoved, Absent, nothingLoadedHere).
		Permit(SpecRemoved, DevicePluginDraining, loadedHereWithDevicePlugin).
		Permit(SpecRemoved, Unloading, loadedHereWithoutDevicePlugin).
		Permit(KernelChanged, Absent, nothingLoadedHere)

	sm.Configure(Loaded).
		Permit(NodeRebooted, Loading, nodeKernelMatchesSpec).
		Permit(NodeRebooted, Absent, nodeKernelDiffersFromSpec).
		Permit(SpecRemoved, DevicePluginDraining, drainNeeded).
		Permit(SpecRemoved, Unloading, nothingToDrain).
		Permit(SpecChanged, DevicePluginDraining, drainNeeded).
		Permit(SpecChanged, Unloading, nothingToDrainNoReload).
		Permit(SpecChanged, Loading, reloadable).
		Permit(UpgradeRequested, DevicePluginDraining)

	sm.Configure(DevicePluginDraining).
		Permit(DevicePluginGone, Unloading).
		PermitReentry(ClaimsAllocated).
		PermitReentry(WaitingForJobs).
		PermitReentry(JobWaitExpired).
		Permit(SpecRestored, Loaded).
		Permit(NodeRebooted, Loading, nodeKernelMatchesSpec).
		Permit(NodeRebooted, Absent, nodeKernelDiffersFromSpec)

	sm.Configure(Unloading).
		Permit(WorkerSucceeded, Upgrading, upgradeInProgress).
		Permit(WorkerSucceeded, Absent, noUpgradeInProgress).
		Permit(WorkerFailed, UnloadBackOff).
		Permit(HookFailed, UnloadBackOff).
		Permit(WorkerTimedOut, UnloadBackOff).
		Permit(WorkerRejected, UnloadBackOff).
		Permit(SpecRestored, Loaded).
		Permit(NodeRebooted, Absent)

	sm.Configure(UnloadBackOff).
		Permit(BackOffExpired, Unloading).
		Permit(WorkerSucceeded, Upgrading, upgradeInProgress).
		Permit(WorkerSucceeded, Absent, noUpgradeInProgress).
		Permit(SpecRestored, Loaded).
		Permit(NodeRebooted, Absent)

	sm.Configure(Upgrading).
		Permit(SpecSet, Loading, nodeKernelMatchesSpec).
		Permit(UpgradeAbandoned, Absent)
}

// Guards. They read the facts of the Fire call; their names appear in the diagrams.

func nodeKernelMatchesSpec(ctx context.Context, _ ...any) bool {
	return pairFrom(ctx).facts.specKernelMatches()
}

func nodeKernelDiffersFromSpec(ctx context.Context, args ...any) bool {
	return !nodeKernelMatchesSpec(ctx, args...)
}

// upstreamRecordMatchesSpec: what upstream KMM recorded as loaded is the spec's config, on the
// node's kernel, in its current boot.
func upstreamRecordMatchesSpec(ctx context.Context, _ ...any) bool {
	return pairFrom(ctx).facts.adoptable()
}

// drainNeeded: the module's device plugin (or DRA driver) pod, workload pods its upgrade drain
// selects, or ResourceClaims allocated with its DRA driver's devices are still on the node: they
// must go before an unload.
func drainNeeded(ctx context.Context, _ ...any) bool {
	f := pairFrom(ctx).facts
	return f.DevicePluginRunning || len(f.remainingWorkloads()) > 0 || len(f.Claims) > 0
}

func nothingToDrain(ctx context.Context, args ...any) bool {
	return !drainNeeded(ctx, args...)
}

// reloadable: one worker may unload the loaded config and load the spec's (Facts.reloadable).
func reloadable(ctx context.Context, _ ...any) bool {
	return pairFrom(ctx).facts.reloadable()
}

// nothingToDrainNoReload: nothing to drain, and the change is not one a reload worker makes.
func nothingToDrainNoReload(ctx context.Context, args ...any) bool {
	return nothingToDrain(ctx, args...) && !reloadable(ctx, args...)
}

// reloadKeptPrevious: the failed worker is a reload that did not unload the previous config.
func reloadKeptPrevious(ctx context.Context, _ ...any) bool {
	return pairFrom(ctx).facts.reloadKeptPrevious()
}

// previousNotLoaded: the failed worker is a load, or a reload whose unload half succeeded.
func previousNotLoaded(ctx context.Context, args ...any) bool {
	return !reloadKeptPrevious(ctx, args...)
}

// nothingLoadedHere: no config recorded as loaded for the kernel the node runs.
func nothingLoadedHere(ctx context.Context, _ ...any) bool {
	return !pairFrom(ctx).facts.statusKernelMatches()
}

// loadedHereWithDevicePlugin: a config is loaded for the node's kernel and something must be drained first.
func loadedHereWithDevicePlugin(ctx context.Context, args ...any) bool {
	return !nothingLoadedHere(ctx, args...) && drainNeeded(ctx, args...)
}

// loadedHereWithoutDevicePlugin: a config is loaded for the node's kernel and nothing to drain.
func loadedHereWithoutDevicePlugin(ctx context.Context, args ...any) bool {
	return !nothingLoadedHere(ctx, args...) && !drainNeeded(ctx, args...)
}

func upgradeInProgress(ctx context.Context, _ ...any) bool {
	return pairFrom(ctx).facts.upgradeInProgress()
}

func noUpgradeInProgress(ctx context.Context, args ...any) bool {
	return !upgradeInProgress(ctx, args...)
}

// fire fires t on a pair in state from, with facts f, and returns the state it leads to.
func fire(from State, t Trigger, f *Facts) (State, error) {
	p := &pair{state: from, facts: f}
	ctx := context.WithValue(context.Background(), pairKey{}, p)
	if err := Machine().FireCtx(ctx, t); err != nil {
		return from, err
	}
	return p.state, nil
}
