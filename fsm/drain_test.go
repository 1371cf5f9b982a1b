package fsm

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

func drainingFacts(elapsed time.Duration, policy kmmv1beta1.DrainSpec, pods ...WorkloadPod) Facts {
	v1 := entry(k1, "r/m:v1", "v1")
	st := loaded(DevicePluginDraining, v1)
	st.Drain = &kmmv1beta1.DrainStatus{StartTime: metav1.NewTime(t0.Add(-elapsed)), CordonedByKMM: true}
	node := readyNode(k1)
	node.UpgradeTarget, node.Schedulable = "v2", false
	f := facts(nil, st, node)
	f.Drain = DrainFacts{Policy: &policy, Pods: pods, NodeCordoned: true}
	return f
}

var (
	plain   = WorkloadPod{Namespace: "app", Name: "plain"}
	guarded = WorkloadPod{Namespace: "app", Name: "guarded", PDBProtected: true}
	stuck   = WorkloadPod{Namespace: "app", Name: "stuck", Terminating: true, Finalizers: true}
	system  = WorkloadPod{Namespace: "kube-system", Name: "sys"}
	daemon  = WorkloadPod{Namespace: "app", Name: "daemon", DaemonSet: true}
	policy  = kmmv1beta1.DrainSpec{TimeoutSeconds: 60, PDBForceDrainTimeoutSeconds: 300, IgnoredNamespacePatterns: []string{"^kube-"}}
)

// TestDrainEscalates follows seed 004's strategies as time passes since the drain started.
func TestDrainEscalates(t *testing.T) {
	names := func(ps []WorkloadPod) string {
		s := ""
		for _, p := range ps {
			s += p.Name + " "
		}
		return s
	}
	cases := []struct {
		name                        string
		elapsed                     time.Duration
		policy                      kmmv1beta1.DrainSpec
		evict, del, strip, strategy string
		timedOut                    bool
	}{
		{"before the timeout: evict only, PDBs honoured by the Eviction API", 10 * time.Second, policy, "plain guarded ", "", "", StrategyEvict, false},
		{"after timeoutSeconds: delete non-PDB pods, strip finalizers of stuck ones", 61 * time.Second, policy, "guarded ", "plain ", "stuck ", StrategyDeleteNonPDB, false},
		{"after pdbForceDrainTimeoutSeconds: PDB pods too", 301 * time.Second, policy, "", "plain guarded ", "stuck ", StrategyForceDeletePDB, true},
		{"with an expected drain time, PDB pods wait for it too", 301 * time.Second, withExpected(policy, 120), "guarded ", "plain ", "stuck ", StrategyDeleteNonPDB, false},
		{"after expected drain time + pdbForceDrainTimeoutSeconds: PDB pods too", 421 * time.Second, withExpected(policy, 120), "", "plain guarded ", "stuck ", StrategyForceDeletePDB, true},
		{"strategies disabled: eviction only, timed out after the timeout", 400 * time.Second,
			kmmv1beta1.DrainSpec{TimeoutSeconds: 60, PDBForceDrainTimeoutSeconds: 300, DisableDrainStrategies: true, IgnoredNamespacePatterns: []string{"^kube-"}}, "plain guarded ", "", "", StrategyEvict, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Step(drainingFacts(tc.elapsed, tc.policy, plain, guarded, stuck, system, daemon))
			p := r.Plan.Drain
			if p == nil {
				t.Fatal("no drain plan")
			}
			if names(p.Evict) != tc.evict || names(p.Delete) != tc.del || names(p.StripFinalizers) != tc.strip || p.Strategy != tc.strategy || p.TimedOut != tc.timedOut {
				t.Fatalf("plan evict[%s] delete[%s] strip[%s] %s timedOut %v", names(p.Evict), names(p.Delete), names(p.StripFinalizers), p.Strategy, p.TimedOut)
			}
			if r.Status.Drain.LastStrategy != tc.strategy || r.Status.State != DevicePluginDraining {
				t.Fatalf("status drain %+v state %s", r.Status.Drain, r.Status.State)
			}
		})
	}
}

func TestDrainStartsCordonsAndFinishes(t *testing.T) {
	v1 := entry(k1, "r/m:v1", "v1")
	node := readyNode(k1)
	node.UpgradeTarget = "v2"
	f := facts(v1, loaded(Loaded, v1), node)
	f.Drain = DrainFacts{Policy: &policy, Pods: []WorkloadPod{plain}}
	r := check(t, f, want{state: DevicePluginDraining})
	if r.Status.Drain == nil || !r.Status.Drain.StartTime.Equal(&metav1.Time{Time: t0}) || !r.Plan.Drain.Cordon || !r.Status.Drain.CordonedByKMM {
		t.Fatalf("drain not started and cordon not recorded: %+v %+v", r.Status.Drain, r.Plan.Drain)
	}

	// Spec removed (step 3), device plugin gone, a workload still there: no unload yet.
	f = drainingFacts(time.Second, policy, plain)
	check(t, f, want{state: DevicePluginDraining})
	// Only an ignored-namespace pod left: the drain is done.
	f = drainingFacts(time.Second, policy, system)
	check(t, f, want{state: Unloading, create: contract.ActionUnload}) // our own cordon does not block the unload
}

func TestUncordonOnceTheNewVersionIsLoaded(t *testing.T) {
	v2 := entry(k1, "r/m:v2", "v2")
	st := kmmv1beta1.NodeModuleStatus{State: Loading, Drain: &kmmv1beta1.DrainStatus{StartTime: metav1.NewTime(t0), CordonedByKMM: true}}
	node := readyNode(k1)
	node.Schedulable, node.UpgradeTarget = false, "v2"
	f := facts(v2, st, node)
	f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *v2, Result: contract.Result{BootID: "b1"}}
	r := check(t, f, want{state: Loaded, delete: true, ready: true})
	if !r.Plan.Uncordon || r.Status.Drain == nil || !r.Status.Drain.CordonedByKMM {
		t.Fatalf("uncordon %v drain %+v: want an uncordon, the record kept until the node shows it", r.Plan.Uncordon, r.Status.Drain)
	}

	// The uncordon failed (or the cache has not seen it yet): the next reconcile asks again.
	f = facts(v2, *r.Status, node)
	r = Step(f)
	if !r.Plan.Uncordon || r.Status.Drain == nil || len(r.Fired) != 0 {
		t.Fatalf("after a failed uncordon: uncordon %v drain %+v fired %v", r.Plan.Uncordon, r.Status.Drain, r.Fired)
	}

	// The node shows the cordon lifted: the record goes, nothing more to do.
	node.Schedulable = true
	f = facts(v2, *r.Status, node)
	r = Step(f)
	if r.Plan.Uncordon || r.Status.Drain != nil {
		t.Fatalf("once uncordoned: uncordon %v drain %+v", r.Plan.Uncordon, r.Status.Drain)
	}
}

func TestUncordonPendingKeepsTheEntryOfAnUnloadedPair(t *testing.T) {
	st := kmmv1beta1.NodeModuleStatus{State: Absent, Drain: &kmmv1beta1.DrainStatus{StartTime: metav1.NewTime(t0), CordonedByKMM: true}}
	node := readyNode(k1)
	node.Schedulable = false
	r := Step(facts(nil, st, node))
	if !r.Plan.Uncordon || r.Status == nil || r.Status.Drain == nil {
		t.Fatalf("uncordon %v status %+v: want the uncordon and the entry kept", r.Plan.Uncordon, r.Status)
	}
	node.Schedulable = true
	if r = Step(facts(nil, *r.Status, node)); r.Plan.Uncordon || r.Status != nil {
		t.Fatalf("uncordon %v status %+v: want the entry gone once the node is uncordoned", r.Plan.Uncordon, r.Status)
	}
}

// TestUpgradeAbandonedWhenTheNodeBootsAKernelWithNoMapping: mid-upgrade the node comes back on a
// kernel no mapping serves, so the Module→NMC controller keeps the entry for the kernel it ran
// before. Once the grace is over the pair gives the upgrade up and kmm lifts its cordon (rapid
// seed 10071139628671759194 found the pair waiting in Upgrading for good, the node cordoned).
func TestUpgradeAbandonedWhenTheNodeBootsAKernelWithNoMapping(t *testing.T) {
	v1 := entry(k1, "r/m:v1", "v1") // the entry kept for the kernel the node ran before
	node := readyNode(k2)
	node.Schedulable, node.UpgradeTarget, node.WorkerPodVersion = false, "v2", "v2"
	st := kmmv1beta1.NodeModuleStatus{State: Upgrading, LastTransitionTime: metav1.NewTime(t0.Add(-time.Second)),
		Drain: &kmmv1beta1.DrainStatus{StartTime: metav1.NewTime(t0.Add(-time.Minute)), CordonedByKMM: true}}
	r := check(t, facts(v1, st, node), want{state: Upgrading})
	if r.Plan.Uncordon || r.Plan.RequeueAfter != UpgradeSpecGrace-time.Second {
		t.Fatalf("within the grace: uncordon %v requeue %v, want the cordon kept and a look after the grace", r.Plan.Uncordon, r.Plan.RequeueAfter)
	}
	st.LastTransitionTime = metav1.NewTime(t0.Add(-UpgradeSpecGrace))
	r = check(t, facts(v1, st, node), want{state: Absent})
	if !r.Plan.Uncordon || r.Status.Reason != string(UpgradeAbandoned) {
		t.Fatalf("after the grace: uncordon %v reason %q, want the upgrade abandoned and kmm's cordon lifted", r.Plan.Uncordon, r.Status.Reason)
	}
}

func TestNewUpgradeWhileTheCordonIsPendingStartsAFreshDrain(t *testing.T) {
	v2 := entry(k1, "r/m:v2", "v2")
	old := metav1.NewTime(t0.Add(-time.Hour))
	st := kmmv1beta1.NodeModuleStatus{State: Loaded, Config: &entry(k1, "r/m:v2", "v2").Config, BootID: "b1",
		Drain: &kmmv1beta1.DrainStatus{StartTime: old, LastStrategy: "ForceDeletePDB", CordonedByKMM: true}}
	node := readyNode(k1)
	node.Schedulable, node.UpgradeTarget = false, "v3"
	f := facts(v2, st, node)
	f.Drain = DrainFacts{Policy: &kmmv1beta1.DrainSpec{TimeoutSeconds: 60}, NodeCordoned: true}
	r := Step(f)
	if r.Status.State != DevicePluginDraining {
		t.Fatalf("state %s, want %s (fired %v)", r.Status.State, DevicePluginDraining, r.Fired)
	}
	d := r.Status.Drain
	if d == nil || !d.StartTime.Equal(&metav1.Time{Time: t0}) || !d.CordonedByKMM || d.LastStrategy == "ForceDeletePDB" {
		t.Fatalf("drain %+v: want a fresh start at %v that remembers kmm's cordon", d, t0)
	}
}

func TestMayDrain(t *testing.T) {
	cfg := kmmv1beta1.ModuleConfig{KernelVersion: "k", ContainerImage: "r/m:v1", Version: "v1"}
	other := cfg
	other.ContainerImage = "r/m:v2"
	tests := []struct {
		name   string
		state  State
		spec   *kmmv1beta1.ModuleConfig
		target string
		want   bool
	}{
		{"draining", DevicePluginDraining, &cfg, "", true},
		{"loaded, nothing asked", Loaded, &cfg, "", false},
		{"loaded, upgrade asked", Loaded, &cfg, "v2", true},
		{"loaded, spec changed", Loaded, &other, "", true},
		{"loaded, spec removed", Loaded, nil, "", true},
		{"loading, spec changed, something loaded", Loading, &other, "", true},
		{"load back-off, spec removed, something loaded", LoadBackOff, nil, "", true},
		{"unloading", Unloading, &other, "v2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			loaded := cfg
			f := &Facts{Status: kmmv1beta1.NodeModuleStatus{State: tt.state, Config: &loaded}, Node: Node{UpgradeTarget: tt.target}}
			if tt.spec != nil {
				f.Spec = &kmmv1beta1.NodeModuleSpec{Config: *tt.spec}
			}
			if got := f.MayDrain(); got != tt.want {
				t.Errorf("MayDrain() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSpecChangeWhileLoadingDrainsWhatIsLoaded: a pair that is Loading or in LoadBackOff while a
// loaded config is still recorded drains the workloads before the unload, as from Loaded (it used to
// go straight to Unloading: MayDrain answered false outside Loaded, so no workload was read).
func TestSpecChangeWhileLoadingDrainsWhatIsLoaded(t *testing.T) {
	v1, v2 := entry(k1, "r/m:v1", "v1"), entry(k1, "r/m:v2", "v2")
	for _, state := range []State{Loading, LoadBackOff} {
		t.Run(string(state), func(t *testing.T) {
			f := facts(v2, loaded(state, v1), readyNode(k1))
			if !f.MayDrain() {
				t.Fatal("MayDrain() = false with a loaded config and a changed spec")
			}
			f.Drain = DrainFacts{Policy: &policy, Pods: []WorkloadPod{plain}}
			r := check(t, f, want{state: DevicePluginDraining})
			if r.Plan.Drain == nil || len(r.Plan.Drain.Evict) != 1 {
				t.Fatalf("no eviction of the workload planned: %+v", r.Plan.Drain)
			}
		})
	}
}

func withExpected(p kmmv1beta1.DrainSpec, seconds int32) kmmv1beta1.DrainSpec {
	p.ExpectedDrainSeconds = seconds
	return p
}

// TestNodeBoundPodsNeverBlockADrain: a DaemonSet's pod (or a static pod) stays on the node and the
// drain finishes without it (seed 004: any pod but a DaemonSet's).
func TestNodeBoundPodsNeverBlockADrain(t *testing.T) {
	check(t, drainingFacts(time.Second, policy, daemon), want{state: Unloading, create: contract.ActionUnload})
	check(t, drainingFacts(time.Second, policy, WorkloadPod{Namespace: "app", Name: "static", Mirror: true}), want{state: Unloading, create: contract.ActionUnload})
}

// TestSpared: which pods a drain never touches, whatever its podSelector selects.
func TestSpared(t *testing.T) {
	cases := []struct {
		name string
		pod  WorkloadPod
		want string
	}{
		{"a workload", plain, ""},
		{"a workload under a PDB, stuck terminating", WorkloadPod{PDBProtected: true, Terminating: true, Finalizers: true}, ""},
		{"kmm's pod (a worker or device plugin pod of any Module)", WorkloadPod{CreatedByKMM: true}, SparedKMM},
		{"kmm's device plugin pod, a DaemonSet's", WorkloadPod{CreatedByKMM: true, DaemonSet: true}, SparedKMM},
		{"kmm's pod under a PDB, stuck terminating", WorkloadPod{CreatedByKMM: true, PDBProtected: true, Terminating: true, Finalizers: true}, SparedKMM},
		{"a static pod's mirror", WorkloadPod{Mirror: true}, SparedMirror},
		{"a DaemonSet's pod", WorkloadPod{DaemonSet: true}, SparedDaemonSet},
	}
	for _, c := range cases {
		if got := c.pod.Spared(); got != c.want {
			t.Errorf("%s: Spared() = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestDrainNeverTouchesSparedPods: with every pod of the node selected (an empty podSelector), no
// plan of any strategy, at any time, names kmm's pods, a mirror or a DaemonSet's pod, and they do
// not hold the drain back: only the workload does (issue 34: another Module's worker pod was evicted).
func TestDrainNeverTouchesSparedPods(t *testing.T) {
	spared := []WorkloadPod{
		{Namespace: "drivers", Name: "kmm-worker-n1-drivers-gpu", CreatedByKMM: true},
		{Namespace: "drivers", Name: "kmm-worker-n1-drivers-fw", CreatedByKMM: true, Terminating: true, Finalizers: true},
		{Namespace: "drivers", Name: "gpu-device-plugin-x", CreatedByKMM: true, DaemonSet: true, PDBProtected: true},
		{Namespace: "kube-system", Name: "etcd-n1", Mirror: true},
		{Namespace: "app", Name: "log-agent-x", DaemonSet: true, PDBProtected: true},
	}
	everything := kmmv1beta1.DrainSpec{TimeoutSeconds: 60, PDBForceDrainTimeoutSeconds: 300}
	for _, elapsed := range []time.Duration{time.Second, 61 * time.Second, 301 * time.Second, time.Hour} {
		r := Step(drainingFacts(elapsed, everything, append(slices.Clone(spared), plain)...))
		p := r.Plan.Drain
		if p == nil {
			t.Fatalf("after %v: no drain plan", elapsed)
		}
		for _, w := range slices.Concat(p.Evict, p.Delete, p.StripFinalizers) {
			if w.Name != plain.Name {
				t.Errorf("after %v: the plan touches %s/%s (%+v)", elapsed, w.Namespace, w.Name, p)
			}
		}
		if len(p.Evict)+len(p.Delete) != 1 {
			t.Errorf("after %v: the workload is not evicted or deleted: %+v", elapsed, p)
		}
	}
	check(t, drainingFacts(time.Second, everything, spared...), want{state: Unloading, create: contract.ActionUnload})
}
