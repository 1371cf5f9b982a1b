package fsm

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

var (
	gpuUser    = WorkloadPod{Namespace: "app", Name: "gpu-user", OutsideSelector: true, Resources: []string{"cpu", "example.com/gpu"}}
	otherUser  = WorkloadPod{Namespace: "app", Name: "other-user", OutsideSelector: true, Resources: []string{"example.com/fpga"}}
	claimUser  = WorkloadPod{Namespace: "app", Name: "claim-user", OutsideSelector: true, HoldsClaim: true}
	bystander  = WorkloadPod{Namespace: "app", Name: "bystander", OutsideSelector: true}
	selected   = WorkloadPod{Namespace: "app", Name: "selected"}
	selectorOn = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
)

// TestConcerns is which pods a drain concerns, by podSelector and deviceUsers.
func TestConcerns(t *testing.T) {
	gpu := &kmmv1beta1.DrainDeviceUsers{ExtendedResources: []string{"example.com/gpu"}}
	claims := &kmmv1beta1.DrainDeviceUsers{ResourceClaims: true}
	cases := []struct {
		name   string
		policy kmmv1beta1.DrainSpec
		pod    WorkloadPod
		want   bool
	}{
		{"no podSelector, no deviceUsers: every pod (today's behaviour)", kmmv1beta1.DrainSpec{}, selected, true},
		{"podSelector selects it", kmmv1beta1.DrainSpec{PodSelector: selectorOn}, selected, true},
		{"podSelector does not select it, no deviceUsers", kmmv1beta1.DrainSpec{PodSelector: selectorOn}, gpuUser, false},
		{"outside the podSelector, requests a listed resource", kmmv1beta1.DrainSpec{PodSelector: selectorOn, DeviceUsers: gpu}, gpuUser, true},
		{"outside the podSelector, requests another resource", kmmv1beta1.DrainSpec{PodSelector: selectorOn, DeviceUsers: gpu}, otherUser, false},
		{"deviceUsers without podSelector: a pod without devices is left", kmmv1beta1.DrainSpec{DeviceUsers: gpu}, WorkloadPod{Namespace: "app", Name: "x"}, false},
		{"deviceUsers without podSelector: the device user goes", kmmv1beta1.DrainSpec{DeviceUsers: gpu}, WorkloadPod{Namespace: "app", Name: "x", Resources: []string{"example.com/gpu"}}, true},
		{"a claim holder, resourceClaims set", kmmv1beta1.DrainSpec{PodSelector: selectorOn, DeviceUsers: claims}, claimUser, true},
		{"a claim holder, only extendedResources set", kmmv1beta1.DrainSpec{PodSelector: selectorOn, DeviceUsers: gpu}, claimUser, false},
		{"a bystander", kmmv1beta1.DrainSpec{PodSelector: selectorOn, DeviceUsers: &kmmv1beta1.DrainDeviceUsers{ExtendedResources: []string{"example.com/gpu"}, ResourceClaims: true}}, bystander, false},
		{"the Module's own DRA driver, whatever the selectors", kmmv1beta1.DrainSpec{DeviceUsers: gpu}, WorkloadPod{Namespace: "ns", Name: "drv", OwnDRADriver: true}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Concerns(&tc.policy, tc.pod); got != tc.want {
				t.Fatalf("Concerns = %v, want %v", got, tc.want)
			}
		})
	}
	if Concerns(nil, selected) {
		t.Fatal("no policy concerns a pod")
	}
}

// TestDrainEvictsDeviceUsers: a pod requesting the device plugin's resource is drained though the
// podSelector does not select it, and the unload waits for it; a pod of another resource stays.
func TestDrainEvictsDeviceUsers(t *testing.T) {
	pol := policy
	pol.PodSelector = selectorOn
	pol.DeviceUsers = &kmmv1beta1.DrainDeviceUsers{ExtendedResources: []string{"example.com/gpu"}, ResourceClaims: true}
	r := Step(drainingFacts(10*time.Second, pol, gpuUser, claimUser, otherUser, bystander))
	if got := podNames(r.Plan.Drain.Evict); got != "gpu-user claim-user " {
		t.Fatalf("evicted %q, want the gpu user and the claim holder only", got)
	}
	if r.Status.State != DevicePluginDraining {
		t.Fatalf("state %s: the unload must wait for the device users", r.Status.State)
	}
	// Only pods that use no device of the Module left: the unload goes on.
	f := drainingFacts(10*time.Second, pol, otherUser, bystander)
	check(t, f, want{state: Unloading, create: contract.ActionUnload})
	// Without deviceUsers (today's behaviour), the same pods are no drain's business.
	pol.DeviceUsers = nil
	check(t, drainingFacts(10*time.Second, pol, gpuUser, claimUser), want{state: Unloading, create: contract.ActionUnload})
}

func podNames(ps []WorkloadPod) string {
	s := ""
	for _, p := range ps {
		s += p.Name + " "
	}
	return s
}

// TestDrainWaitsForJobs follows a Job pod through the wait and the escalation after it.
func TestDrainWaitsForJobs(t *testing.T) {
	job := WorkloadPod{Namespace: "app", Name: "job", Job: true}
	jobGuarded := WorkloadPod{Namespace: "app", Name: "job-guarded", Job: true, PDBProtected: true}
	pol := policy // timeoutSeconds 60, pdbForceDrainTimeoutSeconds 300
	pol.Jobs = &kmmv1beta1.DrainJobs{WaitSeconds: 600}
	cases := []struct {
		name                          string
		elapsed                       time.Duration
		policy                        kmmv1beta1.DrainSpec
		evict, del, waiting, strategy string
		timedOut                      bool
	}{
		{"during the wait: the plain pod is evicted, the Job pods waited for", 10 * time.Second, pol, "plain ", "", "job job-guarded ", StrategyEvict, false},
		{"the wait outlasts timeoutSeconds: plain deleted, Job pods still waited for", 100 * time.Second, pol, "", "plain ", "job job-guarded ", StrategyDeleteNonPDB, false},
		{"the wait is over: Job pods evicted, their clock starts now", 601 * time.Second, pol, "job job-guarded ", "plain ", "", StrategyDeleteNonPDB, false},
		{"timeoutSeconds after the wait: the Job pod deleted, the PDB one evicted", 661 * time.Second, pol, "job-guarded ", "plain job ", "", StrategyDeleteNonPDB, false},
		{"pdbForce after the wait: all deleted, the drain timed out", 901 * time.Second, pol, "", "plain job job-guarded ", "", StrategyForceDeletePDB, true},
		{"without jobs (today's behaviour): Job pods are pods", 10 * time.Second, policy, "plain job job-guarded ", "", "", StrategyEvict, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Step(drainingFacts(tc.elapsed, tc.policy, plain, job, jobGuarded))
			p := r.Plan.Drain
			if podNames(p.Evict) != tc.evict || podNames(p.Delete) != tc.del || podNames(p.WaitingForJobs) != tc.waiting || p.Strategy != tc.strategy || p.TimedOut != tc.timedOut {
				t.Fatalf("plan evict[%s] delete[%s] waiting[%s] %s timedOut %v", podNames(p.Evict), podNames(p.Delete), podNames(p.WaitingForJobs), p.Strategy, p.TimedOut)
			}
		})
	}
	// The drain's give-up time, which the rollout's DrainTimedOut reads too, counts the wait.
	if got := pol.GiveUp(); got != 900*time.Second {
		t.Fatalf("GiveUp %v, want 900s (600 s wait + 300 s escalation)", got)
	}
}

// TestJobWaitSaidOnce: WaitingForJobs once when the wait starts, JobWaitExpired once when it ends
// with Job pods left, neither again, and the drain's start kept through both reentries.
func TestJobWaitSaidOnce(t *testing.T) {
	job := WorkloadPod{Namespace: "app", Name: "job", Job: true}
	pol := policy
	pol.Jobs = &kmmv1beta1.DrainJobs{WaitSeconds: 600}
	f := drainingFacts(time.Second, pol, job)
	start := f.Status.Drain.StartTime
	r := Step(f)
	if len(r.Fired) != 1 || r.Fired[0].Trigger != string(WaitingForJobs) || r.Status.Reason != string(WaitingForJobs) ||
		!strings.Contains(r.Status.Message, "app/job") || r.Status.Drain.JobWait != kmmv1beta1.JobWaitWaiting {
		t.Fatalf("first step: fired %v reason %s message %q drain %+v", r.Fired, r.Status.Reason, r.Status.Message, r.Status.Drain)
	}
	if !r.Status.Drain.StartTime.Equal(&start) {
		t.Fatalf("the reentry restarted the drain: %v, started %v", r.Status.Drain.StartTime, start)
	}
	f.Status = *r.Status
	if r = Step(f); len(r.Fired) != 0 {
		t.Fatalf("said again: %v", r.Fired)
	}
	f.Status, f.Now = *r.Status, f.Now.Add(600*time.Second)
	r = Step(f)
	if len(r.Fired) != 1 || r.Fired[0].Trigger != string(JobWaitExpired) || r.Status.Reason != string(JobWaitExpired) ||
		!strings.Contains(r.Status.Message, "evicted now") || r.Status.Drain.JobWait != kmmv1beta1.JobWaitExpired {
		t.Fatalf("at the wait's end: fired %v reason %s message %q", r.Fired, r.Status.Reason, r.Status.Message)
	}
	if !IsWarning(JobWaitExpired) || IsFailure(JobWaitExpired) {
		t.Fatal("JobWaitExpired is a Warning Event and no failed attempt")
	}
	f.Status = *r.Status
	if r = Step(f); len(r.Fired) != 0 || r.Status.Attempts != 0 {
		t.Fatalf("said again: %v (attempts %d)", r.Fired, r.Status.Attempts)
	}
	// A Job that ended during the wait: nothing to say, the unload goes on.
	f = drainingFacts(time.Second, pol)
	check(t, f, want{state: Unloading, create: contract.ActionUnload})
}

// TestMayDrainAfterALoad: a load that succeeded may be taken on to Loaded and to an unload in one
// step, so the reconciler reads the workload pods then too (the model found the drain skipped).
func TestMayDrainAfterALoad(t *testing.T) {
	v1 := entry(k1, "r/m:v1", "v1")
	node := readyNode(k1)
	f := facts(nil, kmmv1beta1.NodeModuleStatus{State: Loading}, node)
	f.Drain = DrainFacts{Policy: &policy}
	if f.MayDrain() {
		t.Fatal("a load still running needs no workload pods")
	}
	f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *v1, EntryKnown: true, Result: contract.Result{BootID: "b1"}}
	if !f.MayDrain() {
		t.Fatal("a load that succeeded while its spec entry went may unload in the same step: the workloads are facts")
	}
	if f.MayUnload() {
		t.Fatal("a first load cannot have claims of the driver on the node: no cluster-wide ResourceClaims read for it")
	}
	f.Drain.Pods = []WorkloadPod{plain}
	if r := Step(f); r.Status.State != DevicePluginDraining {
		t.Fatalf("state %s after the load and the removed spec, with a workload: want DevicePluginDraining", r.Status.State)
	}
}

// TestMayDrainAnUpstreamRecord: a record upstream KMM left (no state), or an Absent record of a
// config still in the kernel, with no spec entry wanting it, may be unloaded in this step: the
// workload pods are facts (the explorer found the unload beside them at depth 4).
func TestMayDrainAnUpstreamRecord(t *testing.T) {
	v1 := entry(k1, "r/m:v1", "v1")
	for _, state := range []State{"", Absent} {
		st := kmmv1beta1.NodeModuleStatus{State: state, Config: &v1.Config}
		f := facts(nil, st, readyNode(k1))
		f.Drain = DrainFacts{Policy: &policy}
		if !f.MayDrain() {
			t.Fatalf("a record (state %q) of a config no spec entry wants: the workloads are facts", state)
		}
		f = facts(v1, st, readyNode(k1))
		f.Drain = DrainFacts{Policy: &policy}
		if f.MayDrain() {
			t.Fatalf("a record (state %q) of the config the spec wants needs no workload pods", state)
		}
	}
}
