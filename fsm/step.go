package fsm

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/semantic"
)

// maxTriggersPerStep bounds the transitions one decision may chain (facts do not change within a
// step, so a longer chain would be a cycle).
const maxTriggersPerStep = 8

// drainPoll is how often a draining pair looks at its workload pods again.
const drainPoll = 2 * time.Second

// Result is the NMC decision for one pair.
type Result struct {
	// Status is the new status entry; nil means the entry should be removed (nothing loaded,
	// nothing wanted, no pod left).
	Status *kmmv1beta1.NodeModuleStatus
	// Fired are the transitions this step made, oldest first.
	Fired []kmmv1beta1.Transition
	// Plan is what the reconciler must make true while the pair is in its (new) state.
	Plan Plan
	// Err is set when a derived trigger was not permitted (ErrNotPermitted); Status then holds
	// the transitions made before it.
	Err error
	// Message explains the last transition (also when Status is nil: the pair left the table).
	Message string
}

// Plan is the side effects the reconciler carries out, each idempotent.
type Plan struct {
	// CreateWorker, when set, is the worker pod to create.
	CreateWorker *WorkerIntent
	// DeleteWorker asks to delete the pair's finished worker pod (its outcome is recorded).
	DeleteWorker bool
	// Ready says whether the node should carry the module's ready label.
	Ready bool
	// VersionReady is the value of the version.ready label ("" removes it).
	VersionReady string
	// RequeueAfter asks for another decision after this long (0: only on events).
	RequeueAfter time.Duration
	// Waiting says why nothing moves, for logs and Events ("" when not waiting).
	Waiting string
	// Drain is the upgrade drain to carry out (nil: none).
	Drain *DrainPlan
	// Uncordon asks to uncordon the node this pair's drain cordoned.
	Uncordon bool
}

// WorkerIntent is a worker pod to create.
type WorkerIntent struct {
	Action  contract.Action
	Attempt int32
	// Entry is what the pod loads (load, reload) or unloads (unload).
	Entry kmmv1beta1.NodeModuleSpec
	// Previous is, for a reload, the loaded config the pod unloads before it loads Entry.
	Previous *kmmv1beta1.ModuleConfig
}

// Step decides for one pair: it fires the triggers the facts amount to, records each transition in
// the status entry, and plans the side effects of the resulting state.
func Step(f Facts) Result {
	st := *f.Status.DeepCopy()
	if UpstreamRecord(&st) {
		if why := f.upstreamMustWait(); why != "" {
			// Nothing is decided, so nothing is recorded: the entry stays upstream's until it can be.
			return Result{Status: &st, Plan: Plan{Waiting: why, RequeueAfter: UpstreamWait}}
		}
		f.fromUpstream = true
		normalizeUpstream(&st, f.Spec)
	}
	if st.State == "" {
		st.State = Absent
		st.LastTransitionTime = metav1.NewTime(f.Now)
	}
	var res Result
	for range maxTriggersPerStep {
		f.Status = st
		t, ok := derive(&f)
		if !ok {
			break
		}
		to, err := fire(st.State, t, &f)
		if err != nil {
			res.Err = err
			break
		}
		tr := record(&st, t, to, &f)
		res.Fired = append(res.Fired, tr)
		res.Message = st.Message
		if t == WorkerTimedOut {
			// The overdue pod may succeed before its deletion lands (the deletion then fails on
			// its precondition): decide the rest once its fate is known, so that a late success
			// is still met in the back-off state that takes it (found by the rapid model: a
			// spec removed meanwhile took the pair on to Absent, and a load that succeeded late
			// stayed in the kernel with no record).
			break
		}
	}
	recordHooks(&st, &f)
	recordDrain(&st, &f, nil)
	f.Status = st
	drain := planDrain(&f)
	recordDrain(&st, &f, drain)
	f.Status = st
	res.Plan = plan(&f)
	res.Plan.Drain = drain
	if drain != nil && (res.Plan.RequeueAfter == 0 || res.Plan.RequeueAfter > drainPoll) {
		res.Plan.RequeueAfter = drainPoll // workload pods are not watched: look again soon
	}
	res.Plan.Uncordon = uncordonPending(&st, &f)
	if keepEntry(&st, &f) {
		res.Status = &st
	}
	return res
}

// keepEntry says whether the pair's status entry stays: an Absent entry goes when nothing is wanted,
// no pod or drain is left and nothing may be loaded (a stranded record waits for a usable node to
// unload it).
func keepEntry(st *kmmv1beta1.NodeModuleStatus, f *Facts) bool {
	return st.State != Absent || f.Spec != nil || f.Worker.Phase == PodRunning || st.Drain != nil || f.strandedLoad()
}

// record updates the status entry for a transition and appends it to the bounded log. It only
// records: side effects belong to the Plan.
func record(st *kmmv1beta1.NodeModuleStatus, t Trigger, to State, f *Facts) kmmv1beta1.Transition {
	from := st.State
	recordOutcome(st, t, from, f)
	// A reload after a Ready transition (seed 000's rule 5) keeps the record: the old config may
	// still be loaded, so a different spec must unload it first.
	if to == DevicePluginDraining && from != DevicePluginDraining && st.Drain != nil {
		// A new upgrade while the last one's cordon is still to be lifted: a new drain, which
		// remembers that the cordon is kmm's.
		st.Drain = &kmmv1beta1.DrainStatus{StartTime: metav1.NewTime(f.Now), CordonedByKMM: st.Drain.CordonedByKMM}
	}
	reason := reasonFor(t, f)
	tr := kmmv1beta1.Transition{Trigger: string(t), From: from, To: to, Time: metav1.NewTime(f.Now), Reason: reason}
	st.Transitions = append(st.Transitions, tr)
	if n := len(st.Transitions); n > kmmv1beta1.MaxTransitionLog {
		st.Transitions = st.Transitions[n-kmmv1beta1.MaxTransitionLog:]
	}
	st.State, st.LastTransitionTime, st.Reason = to, tr.Time, reason
	st.Message = messageFor(t, f)
	noteJobWait(st, t)
	return tr
}

// recordOutcome records what a transition from state from says about the kernel: a config loaded
// or unloaded, an adopted record, a failed attempt, or a reboot that unloaded everything.
func recordOutcome(st *kmmv1beta1.NodeModuleStatus, t Trigger, from State, f *Facts) {
	if recordedFailedLoad(st, t, from, f) {
		return
	}
	switch {
	case t == WorkerSucceeded && (from == Loading || from == LoadBackOff):
		recordLoaded(st, f)
	case t == WorkerSucceeded && (from == Unloading || from == UnloadBackOff):
		recordUnloaded(st, f)
	case t == Adopted:
		recordAdopted(st, f)
	case IsFailure(t):
		st.Attempts++
	case t == NodeRebooted && (f.rebootedByBootID() || !f.statusKernelMatches()):
		// Nothing survives a reboot: the record says so, and a reload starts afresh.
		recordUnloaded(st, f)
		st.LastWorkerTime = nil
	}
}

// recordedFailedLoad records a failed load that changed the kernel, and says whether t was one.
func recordedFailedLoad(st *kmmv1beta1.NodeModuleStatus, t Trigger, from State, f *Facts) bool {
	switch {
	case (t == HookFailed || t == WorkerFailed) && f.loadedByFailedHook() && (from == Loading || from == LoadBackOff):
		// The load succeeded and its postLoad hook failed: the module is in the kernel.
		recordFailedLoad(st, from, func() { recordLoaded(st, f) })
	case t == WorkerFailed && f.reloadUnloadedPrevious():
		// The reload's unload half succeeded: nothing is loaded, as after a failed load.
		recordFailedLoad(st, from, func() { recordUnloaded(st, f) })
	default:
		return false
	}
	return true
}

// recordFailedLoad records what a failed load left in the kernel (record) and counts the failure,
// unless it is the late end of an attempt whose time-out LoadBackOff counted already.
func recordFailedLoad(st *kmmv1beta1.NodeModuleStatus, from State, record func()) {
	attempts := st.Attempts
	record()
	st.Attempts = attempts
	if from != LoadBackOff {
		st.Attempts++
	}
}

func recordLoaded(st *kmmv1beta1.NodeModuleStatus, f *Facts) {
	cfg := *f.Worker.Entry.Config.DeepCopy()
	st.Config = &cfg
	st.ServiceAccountName = f.Worker.Entry.ServiceAccountName
	st.ImageRepoSecret = f.Worker.Entry.ImageRepoSecret.DeepCopy()
	st.Tolerations = copyTolerations(f.Worker.Entry.Tolerations)
	st.BootID = f.Worker.Result.BootID
	if st.BootID == "" {
		st.BootID = f.Node.BootID
	}
	st.ImageDigest = f.Worker.Result.ImageDigest
	now := metav1.NewTime(f.Now)
	st.LastWorkerTime = &now
	st.Attempts = 0
}

// recordHooks keeps the hooks of the spec entry beside a loaded config: an unload runs the
// preUnload hook of the spec entry while there is one (a fixed hook is the next attempt's), else the
// one recorded while the entry existed (the Module was deleted).
func recordHooks(st *kmmv1beta1.NodeModuleStatus, f *Facts) {
	switch {
	case st.Config == nil:
		st.Hooks = nil
	case f.Spec != nil:
		st.Hooks = f.Spec.Hooks.DeepCopy()
	}
}

func recordUnloaded(st *kmmv1beta1.NodeModuleStatus, f *Facts) {
	st.Config, st.ServiceAccountName, st.ImageRepoSecret, st.Tolerations = nil, "", nil, nil
	st.BootID, st.ImageDigest = "", ""
	now := metav1.NewTime(f.Now)
	st.LastWorkerTime = &now
	st.Attempts = 0
}

// reasonFor is the status reason of a transition: the failure class for a failure (so that
// status.reason says ImagePull, InvalidConfig, TimedOut, ... as data), else the trigger.
func reasonFor(t Trigger, f *Facts) string {
	switch t {
	case WorkerFailed, HookFailed:
		if r := f.Worker.Result.Reason; r != "" {
			return string(r)
		}
	case WorkerTimedOut:
		return ReasonTimedOut
	case WorkerRejected:
		if f.Spec != nil && f.specProblem() != nil {
			return ReasonInvalidConfig
		}
		if r := f.CreateRefused; r != nil && r.Reason != "" {
			return r.Reason
		}
		return ReasonPodRejected
	}
	return string(t)
}

// messageFor explains a transition to a person.
func messageFor(t Trigger, f *Facts) string {
	switch t {
	case WorkerFailed:
		// The class is the status reason; the message is the worker's own.
		msg := f.Worker.Result.Message
		if msg == "" {
			msg = "the " + string(f.Worker.Action) + " worker failed"
		}
		return reloadHalf(f) + msg
	case HookFailed:
		// The tail of the hook's log (or its termination message).
		return f.Worker.Result.Message
	case WorkerTimedOut:
		return "worker pod did not finish within " + f.workerTimeout().String() + ": deleting it and backing off"
	case WorkerRejected:
		if err := f.specProblem(); err != nil {
			return "no worker started, fix the Module: " + err.Error()
		}
		if f.CreateRefused.Reason != "" {
			return "no worker pod made: " + f.CreateRefused.Message
		}
		return "the API server refused the worker pod: " + f.CreateRefused.Message
	case WorkerSucceeded:
		return "worker " + string(f.Worker.Action) + " succeeded"
	case NodeRebooted:
		return "node rebooted or became Ready again since the last worker run"
	case Adopted:
		return "upstream KMM loaded this config in the node's current boot: adopted without a worker"
	case UpgradeRequested:
		return "node asks for version " + f.Node.UpgradeTarget + ": draining the device plugin"
	case ClaimsAllocated:
		return claimsMessage(f.Claims)
	case WaitingForJobs, JobWaitExpired:
		return jobWaitMessage(t, f)
	}
	return triggerMessages[t]
}

// claimsMessage says which ResourceClaims hold the unload back.
func claimsMessage(claims []string) string {
	msg := "ResourceClaims allocated on the node with the DRA driver's devices hold the unload and the driver: " + strings.Join(claims, ", ")
	if len(claims) >= MaxClaimsListed {
		msg += " (and maybe more)"
	}
	return msg + "; delete the pods that use them"
}

// reloadHalf says which half of a failed reload failed, and what is loaded since.
func reloadHalf(f *Facts) string {
	switch {
	case f.reloadUnloadedPrevious():
		return "reload: the old config was unloaded, loading the new one failed: "
	case f.reloadKeptPrevious():
		return "reload: the old config stays loaded (its unload failed or did not run): "
	}
	return ""
}

var triggerMessages = map[Trigger]string{
	SpecSet:          "spec wants the module on this kernel",
	SpecChanged:      "spec differs from the loaded config",
	SpecRemoved:      "spec no longer wants the module",
	SpecRestored:     "spec equals the loaded config again",
	KernelChanged:    "the node runs another kernel than the spec is for",
	BackOffExpired:   "back-off over: retrying",
	DevicePluginGone: "device plugin pod gone from the node",
	UpgradeAbandoned: "upgrade cannot go on: no version requested, or no spec entry for the requested version on the node's kernel",
}

// sameEntry says whether two spec entries ask for the same thing.
func sameEntry(a, b kmmv1beta1.NodeModuleSpec) bool {
	return semantic.Equal(&a.Config, &b.Config)
}
