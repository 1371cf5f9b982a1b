package fsm

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// Drain strategies of seed 004, weakest first; DrainStatus.LastStrategy records the strongest run.
const (
	// StrategyEvict evicts the workload pods through the Eviction API, which honours PodDisruptionBudgets.
	StrategyEvict = "Evict"
	// StrategyDeleteNonPDB deletes the pods no PodDisruptionBudget protects and strips the finalizers
	// of pods stuck terminating (after timeoutSeconds).
	StrategyDeleteNonPDB = "DeleteNonPDB"
	// StrategyForceDeletePDB deletes the PodDisruptionBudget-protected pods too (after
	// pdbForceDrainTimeoutSeconds).
	StrategyForceDeletePDB = "ForceDeletePDB"
)

// WorkloadPod is a pod on the node that the drain's podSelector selects (an empty one selects
// every pod on the node).
type WorkloadPod struct {
	Namespace, Name string
	UID             string
	// PDBProtected: a PodDisruptionBudget selects the pod.
	PDBProtected bool
	// Terminating: the pod has a deletion timestamp.
	Terminating bool
	// Finalizers: the pod has finalizers.
	Finalizers bool
	// CreatedByKMM: kmm created the pod (it carries kmm's managed-by label, contract.CreatedByKMM):
	// a worker pod (load, unload, reload) or a device plugin pod of any Module, or any kind of pod
	// kmm adds later.
	CreatedByKMM bool
	// Mirror: the pod is the mirror of a static pod, which the kubelet runs from a file on the node.
	Mirror bool
	// DaemonSet: a DaemonSet controls the pod.
	DaemonSet bool
	// OwnDRADriver: the pod is the draining Module's own DRA driver pod on the node (a kmm pod and
	// a DaemonSet's, yet never spared: it goes before the unload, evicted last).
	OwnDRADriver bool
	// OutsideSelector: the drain has a podSelector and it does not select the pod (the reconciler
	// read the pod because deviceUsers is set: it may use the Module's devices).
	OutsideSelector bool
	// Resources are the resource names the pod's containers request or limit, sorted, at most
	// MaxPodResources (read only with deviceUsers.extendedResources).
	Resources []string
	// HoldsClaim: a ResourceClaim allocated on the node with devices of the Module's DRA driver
	// (ClaimHoldsNode) is reserved for the pod or named by it (read only with
	// deviceUsers.resourceClaims).
	HoldsClaim bool
	// Job: a Job controls the pod.
	Job bool
}

// MaxPodResources bounds WorkloadPod.Resources: the reconciler keeps the extended resources the
// drain lists first, so that a pod with more names than this is never missed.
const MaxPodResources = 32

// Triggers of the Job wait (upgradePolicy.drain.jobs), reentries of DevicePluginDraining, each said
// once per drain (DrainStatus.JobWait).
const (
	// WaitingForJobs: the drain waits for pods that Jobs control instead of evicting them.
	WaitingForJobs Trigger = "WaitingForJobs"
	// JobWaitExpired: jobs.waitSeconds passed with Job pods left on the node: they are drained as
	// the other pods from now on (a Warning Event).
	JobWaitExpired Trigger = "JobWaitExpired"
)

// Concerns says whether the drain of policy concerns the pod, before what Spared says: the Module's
// own DRA driver pod; a pod the podSelector selects (no podSelector selects every pod on the node,
// unless deviceUsers is set: then none); a pod that uses the Module's devices as deviceUsers says
// (it requests one of extendedResources, or holds a ResourceClaim of the Module's DRA driver with
// resourceClaims). The reconciler reads PodDisruptionBudgets only for the pods it concerns.
func Concerns(policy *kmmv1beta1.DrainSpec, w WorkloadPod) bool {
	if policy == nil {
		return false
	}
	if w.OwnDRADriver {
		return true
	}
	selected := !w.OutsideSelector && (policy.PodSelector != nil || policy.DeviceUsers == nil)
	return selected || usesDevices(policy.DeviceUsers, w)
}

// usesDevices says whether the pod uses the Module's devices as deviceUsers names them.
func usesDevices(du *kmmv1beta1.DrainDeviceUsers, w WorkloadPod) bool {
	if du == nil {
		return false
	}
	if du.ResourceClaims && w.HoldsClaim {
		return true
	}
	return slices.ContainsFunc(w.Resources, func(r string) bool { return slices.Contains(du.ExtendedResources, r) })
}

// Why a drain never touches a pod (WorkloadPod.Spared).
const (
	SparedKMM       = "created by kmm"
	SparedMirror    = "a static pod's mirror"
	SparedDaemonSet = "a DaemonSet's pod"
)

// Spared says why an upgrade drain never evicts, deletes or strips the finalizers of the pod, ""
// when it may. Whatever the podSelector selects, a drain spares kmm's own pods of every Module (a
// worker evicted mid-run leaves its pair to fail and retry, a device plugin evicted takes a
// loaded module's devices away, and neither is a workload of the module drained), the mirror of a
// static pod (the kubelet runs it from a file; evicting the mirror stops nothing) and a DaemonSet's
// pod (it tolerates the cordon and would come straight back: seed 004's predicate, any pod but a
// DaemonSet's, as kubectl drain --ignore-daemonsets). A spared pod never holds the drain back. The
// draining Module's own DRA driver pod is none of these: the drain evicts it, last (planDrain), as
// its DaemonSet stops selecting the node at the same time.
func (w WorkloadPod) Spared() string {
	switch {
	case w.OwnDRADriver:
		return ""
	case w.CreatedByKMM:
		return SparedKMM
	case w.Mirror:
		return SparedMirror
	case w.DaemonSet:
		return SparedDaemonSet
	}
	return ""
}

// DrainFacts are the facts of an upgrade drain.
type DrainFacts struct {
	// Policy is the Module's upgradePolicy.drain; nil means no drain.
	Policy *kmmv1beta1.DrainSpec
	// Pods are the workload pods on the node.
	Pods []WorkloadPod
	// NodeCordoned is the node's spec.unschedulable.
	NodeCordoned bool
}

// DrainPlan is what the reconciler does for a drain.
type DrainPlan struct {
	Cordon, Uncordon bool
	Evict            []WorkloadPod
	Delete           []WorkloadPod
	StripFinalizers  []WorkloadPod
	// Strategy is the strongest strategy this plan runs.
	Strategy string
	// WaitingForJobs are the Job pods the drain waits for (upgradePolicy.drain.jobs): nothing is
	// done to them yet.
	WaitingForJobs []WorkloadPod
	// TimedOut: every strategy has run, the force timeout has passed, and pods remain (seed 004's
	// failed drain; the reconciler raises kmm_node_drain_timeout).
	TimedOut bool
}

// draining says whether the pair drains workloads now.
func (f *Facts) draining() bool {
	return f.state() == DevicePluginDraining && f.Drain.Policy != nil && f.Status.Drain != nil
}

// remainingWorkloads are the pods the drain still waits for (ignored namespaces excluded).
func (f *Facts) remainingWorkloads() []WorkloadPod {
	if f.Drain.Policy == nil {
		return nil
	}
	var out []WorkloadPod
	for _, p := range f.Drain.Pods {
		if p.Spared() == "" && Concerns(f.Drain.Policy, p) && !ignored(f.Drain.Policy, p.Namespace) {
			out = append(out, p)
		}
	}
	return out
}

func ignored(policy *kmmv1beta1.DrainSpec, namespace string) bool {
	for _, pattern := range policy.IgnoredNamespacePatterns {
		if re, err := mapping.CompilePattern(pattern); err == nil && re.MatchString(namespace) {
			return true
		}
	}
	return false
}

// MayDrain says whether the pair is draining or may start to in this step: something is loaded
// (Loaded, or Loading or LoadBackOff while a loaded config is still recorded) and an upgrade is
// requested or the spec no longer equals the loaded config (or an upstream or stranded record holds
// a config that one step may adopt or unload); or a load worker succeeded, which one
// step may take on to Loaded and then to an unload (found by the model's device-user property: the
// drain was skipped when a load ended after its spec entry went). The reconciler reads the node's
// workload pods, an API call, only then.
func (f *Facts) MayDrain() bool {
	return f.firstLoadInKernel() || f.mayDrainRecorded()
}

// firstLoadInKernel says whether a load with nothing recorded as loaded succeeded, or loaded the
// module before its postLoad hook failed: one step may record it (Loaded, or LoadBackOff with the
// config) and go on to an unload (the explorer found the hook case once hooks met device users).
// No DRA driver of the Module can be on the node then (its DaemonSet selects the ready label,
// which comes with Loaded), so no claim of its devices either: MayUnload, which reads the
// cluster's ResourceClaims, leaves this case out.
func (f *Facts) firstLoadInKernel() bool {
	st := f.Status
	return (st.State == Loading || st.State == LoadBackOff) && st.Config == nil && (f.Worker.Phase == PodSucceeded || f.loadedByFailedHook())
}

// mayDrainRecorded is MayDrain from the record: draining, or a config recorded that may be unloaded.
func (f *Facts) mayDrainRecorded() bool {
	st := f.Status
	switch {
	case st.State == DevicePluginDraining:
		return true
	case st.Config == nil:
		return false
	case st.State == Loaded || st.State == Loading || st.State == LoadBackOff,
		// A record upstream KMM left (no state), adopted as Loaded, or an Absent record of a config
		// still in the kernel (strandedLoad) may go on to an unload in the same step (found by the
		// explorer at depth 4 from the world switched from upstream).
		st.State == "" || st.State == Absent:
		return f.Node.UpgradeTarget != "" || f.needsUnload()
	}
	return false
}

// uncordonPending says whether a finished drain's cordon is still on the node.
func uncordonPending(st *kmmv1beta1.NodeModuleStatus, f *Facts) bool {
	return (st.State == Loaded || st.State == Absent) && st.Drain != nil && st.Drain.CordonedByKMM && !f.Node.Schedulable
}

// planDrain escalates through the strategies of seed 004 as the timeouts pass since the drain
// started; with jobs, the pods of Jobs are left alone for jobs.waitSeconds, then drained as the
// others with the strategies' timeouts counted from the wait's end.
func planDrain(f *Facts) *DrainPlan {
	if !f.draining() {
		return nil
	}
	pol := f.Drain.Policy
	elapsed := f.Now.Sub(f.Status.Drain.StartTime.Time)
	wait := pol.JobWait()
	p := &DrainPlan{Cordon: !f.Drain.NodeCordoned, Strategy: StrategyEvict}
	esc, jobEsc := escalationAt(pol, elapsed), escalationAt(pol, elapsed-wait)
	var drivers []WorkloadPod
	others := 0
	for _, w := range f.remainingWorkloads() {
		switch {
		case w.OwnDRADriver:
			drivers = append(drivers, w)
			continue
		case w.Job && wait > 0 && elapsed < wait:
			p.WaitingForJobs = append(p.WaitingForJobs, w)
		case w.Job && wait > 0:
			jobEsc.place(p, w)
		default:
			esc.place(p, w)
		}
		others++
	}
	// The DRA driver unprepares the claims of the pods drained: it goes only once they are gone
	// and no claim of its devices is allocated on the node (upstream KMM's issue 1332).
	if others == 0 && len(f.Claims) == 0 {
		for _, w := range drivers {
			esc.place(p, w)
		}
	}
	p.TimedOut = elapsed >= pol.GiveUp() && len(f.remainingWorkloads()) > 0
	return p
}

// escalationAt says which strategies are due elapsed after the drain (or a Job pod's drain) started.
func escalationAt(pol *kmmv1beta1.DrainSpec, elapsed time.Duration) escalation {
	deleteAfter := time.Duration(pol.TimeoutSeconds) * time.Second
	// Seed 004: the PDB strategy runs at drain start + expected drain time + PDB force timeout.
	forceAfter := time.Duration(pol.ExpectedDrainSeconds+pol.PDBForceDrainTimeoutSeconds) * time.Second
	return escalation{on: !pol.DisableDrainStrategies, deleteDue: elapsed >= deleteAfter, forceDue: elapsed >= forceAfter}
}

// escalation says which strategies are due.
type escalation struct {
	on, deleteDue, forceDue bool
}

// place puts a workload pod under the strongest strategy due for it.
func (e escalation) place(p *DrainPlan, w WorkloadPod) {
	switch {
	case w.Terminating && e.on && e.deleteDue && w.Finalizers:
		p.StripFinalizers = append(p.StripFinalizers, w)
		p.Strategy = strongest(p.Strategy, StrategyDeleteNonPDB)
	case w.Terminating:
		// on its way out
	case e.on && e.forceDue && w.PDBProtected:
		p.Delete, p.Strategy = append(p.Delete, w), StrategyForceDeletePDB
	case e.on && e.deleteDue && !w.PDBProtected:
		p.Delete = append(p.Delete, w)
		p.Strategy = strongest(p.Strategy, StrategyDeleteNonPDB)
	default:
		p.Evict = append(p.Evict, w)
	}
}

var strategyRank = map[string]int{StrategyEvict: 1, StrategyDeleteNonPDB: 2, StrategyForceDeletePDB: 3}

func strongest(a, b string) string {
	if strategyRank[b] > strategyRank[a] {
		return b
	}
	return a
}

// recordDrain keeps the drain's record in the status entry: started on entering
// DevicePluginDraining, strongest strategy and cordon remembered, cleared once Loaded (or Absent)
// again, but not before the node shows kmm's cordon lifted: an uncordon that failed is retried.
func recordDrain(st *kmmv1beta1.NodeModuleStatus, f *Facts, plan *DrainPlan) {
	switch {
	case st.State == DevicePluginDraining && f.Drain.Policy != nil && st.Drain == nil:
		st.Drain = &kmmv1beta1.DrainStatus{StartTime: metav1.NewTime(f.Now)}
	case st.State == Loaded || st.State == Absent:
		if !uncordonPending(st, f) {
			st.Drain = nil
		}
		return
	}
	if st.Drain == nil || plan == nil {
		return
	}
	st.Drain.LastStrategy = strongest(st.Drain.LastStrategy, plan.Strategy)
	st.Drain.CordonedByKMM = st.Drain.CordonedByKMM || plan.Cordon
}

// jobWaitTrigger is the trigger that says, once per drain, that the drain waits for Job pods
// (WaitingForJobs) and, once, that the wait is over with Job pods left (JobWaitExpired); ok is
// false when neither is to be said now.
func jobWaitTrigger(f *Facts) (Trigger, bool) {
	if !f.draining() || f.Drain.Policy.JobWait() == 0 || len(f.jobPods()) == 0 {
		return "", false
	}
	said := f.Status.Drain.JobWait
	if f.jobWaitOver() {
		return JobWaitExpired, said != kmmv1beta1.JobWaitExpired
	}
	return WaitingForJobs, said == ""
}

// jobWaitOver says whether jobs.waitSeconds passed since the drain started.
func (f *Facts) jobWaitOver() bool {
	return f.Now.Sub(f.Status.Drain.StartTime.Time) >= f.Drain.Policy.JobWait()
}

// jobPods are the Job pods among the drain's remaining workloads.
func (f *Facts) jobPods() []WorkloadPod {
	var out []WorkloadPod
	for _, w := range f.remainingWorkloads() {
		if w.Job && !w.OwnDRADriver {
			out = append(out, w)
		}
	}
	return out
}

// noteJobWait records in the drain's record that a Job wait trigger was said.
func noteJobWait(st *kmmv1beta1.NodeModuleStatus, t Trigger) {
	if st.Drain == nil {
		return
	}
	switch t {
	case WaitingForJobs:
		st.Drain.JobWait = kmmv1beta1.JobWaitWaiting
	case JobWaitExpired:
		st.Drain.JobWait = kmmv1beta1.JobWaitExpired
	}
}

// maxJobPodsNamed bounds the Job pods a message names.
const maxJobPodsNamed = 5

// jobWaitMessage explains a Job wait trigger: which pods, until when, and what follows.
func jobWaitMessage(t Trigger, f *Facts) string {
	pol := f.Drain.Policy
	pods := namePods(f.jobPods())
	until := f.Status.Drain.StartTime.Add(pol.JobWait()).UTC().Format(time.RFC3339)
	if t == WaitingForJobs {
		return fmt.Sprintf("waiting for the pods of Jobs to end before the unload: %s; at %s (jobs.waitSeconds %d) they are drained as the other pods",
			pods, until, pol.Jobs.WaitSeconds)
	}
	next := fmt.Sprintf("evicted now, deleted %ds later unless a PodDisruptionBudget protects them, and those %ds later",
		pol.TimeoutSeconds, pol.ExpectedDrainSeconds+pol.PDBForceDrainTimeoutSeconds)
	if pol.DisableDrainStrategies {
		next = "evicted now (disableDrainStrategies: only evicted)"
	}
	return fmt.Sprintf("the pods of Jobs did not end within jobs.waitSeconds (%ds, until %s): %s; they are %s",
		pol.Jobs.WaitSeconds, until, pods, next)
}

// namePods names the pods, at most maxJobPodsNamed, and says how many more.
func namePods(pods []WorkloadPod) string {
	var names []string
	for i, w := range pods {
		if i == maxJobPodsNamed {
			names = append(names, fmt.Sprintf("and %d more", len(pods)-i))
			break
		}
		names = append(names, w.Namespace+"/"+w.Name)
	}
	return strings.Join(names, ", ")
}
