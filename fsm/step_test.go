package fsm

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

const (
	k1 = "6.1.0-56-cloud-amd64"
	k2 = "6.1.0-57-cloud-amd64"
)

func entry(kernel, image, version string) *kmmv1beta1.NodeModuleSpec {
	return &kmmv1beta1.NodeModuleSpec{Namespace: "ns", Name: "m", Config: kmmv1beta1.ModuleConfig{
		KernelVersion: kernel, ContainerImage: image, Version: version,
		Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "m", DirName: "/opt"},
	}}
}

// loaded returns a status entry in state s with e's config loaded in boot "b1".
func loaded(s State, e *kmmv1beta1.NodeModuleSpec) kmmv1beta1.NodeModuleStatus {
	cfg := e.Config
	at := metav1.NewTime(t0.Add(-time.Minute))
	return kmmv1beta1.NodeModuleStatus{Namespace: "ns", Name: "m", State: s, Config: &cfg, BootID: "b1",
		LastWorkerTime: &at, LastTransitionTime: at}
}

func readyNode(kernel string) Node {
	return Node{Ready: true, Schedulable: true, KernelVersion: kernel, BootID: "b1", ReadySince: t0.Add(-time.Hour)}
}

func facts(spec *kmmv1beta1.NodeModuleSpec, status kmmv1beta1.NodeModuleStatus, node Node) Facts {
	if status.Namespace == "" {
		status.Namespace, status.Name = "ns", "m"
	}
	return Facts{Now: t0, Spec: spec, Status: status, Node: node, BackOff: DefaultBackOff}
}

type want struct {
	state   State
	create  contract.Action // "" = no pod created
	delete  bool
	ready   bool
	removed bool // status entry removed
}

func check(t *testing.T, f Facts, w want) Result {
	t.Helper()
	r := Step(f)
	if r.Err != nil {
		t.Fatalf("Step error: %v", r.Err)
	}
	if w.removed {
		if r.Status != nil {
			t.Fatalf("status entry kept in %s, want it removed", r.Status.State)
		}
		return r
	}
	if r.Status == nil || r.Status.State != w.state {
		t.Fatalf("state = %v, want %s (fired %v)", r.Status, w.state, r.Fired)
	}
	var created contract.Action
	if r.Plan.CreateWorker != nil {
		created = r.Plan.CreateWorker.Action
	}
	if created != w.create || r.Plan.DeleteWorker != w.delete || r.Plan.Ready != w.ready {
		t.Fatalf("plan = %+v (create %q), want create %q delete %v ready %v", r.Plan, created, w.create, w.delete, w.ready)
	}
	return r
}

// TestStepSeedRules covers every branch of seed 000's NMC flowchart, one case per rule, plus the
// reboot detection and worker outcomes.
func TestStepSeedRules(t *testing.T) {
	e1 := entry(k1, "r/m:v1", "")
	e1b := entry(k1, "r/m:v1b", "")
	e2 := entry(k2, "r/m:v1", "")
	notReady := readyNode(k1)
	notReady.Ready = false
	cordoned := readyNode(k1)
	cordoned.Schedulable = false
	rebootedReady := readyNode(k1)
	rebootedReady.ReadySince = t0
	newBoot := readyNode(k1)
	newBoot.BootID = "b2"

	cases := []struct {
		name string
		f    Facts
		want want
	}{
		{"rule 1: node NotReady: nothing, even with status missing", facts(e1, kmmv1beta1.NodeModuleStatus{}, notReady), want{state: Absent}},
		{"rule 1: node cordoned: nothing", facts(e1, kmmv1beta1.NodeModuleStatus{}, cordoned), want{state: Absent}},
		{"rule 1: node NotReady with spec removed: no unload pod", facts(nil, loaded(Loaded, e1), notReady), want{state: Loaded, ready: true}},
		{"rule 2: status missing, node kernel equals spec kernel: load pod", facts(e1, kmmv1beta1.NodeModuleStatus{}, readyNode(k1)), want{state: Loading, create: contract.ActionLoad}},
		{"rule 2: status missing, node kernel differs from spec kernel: nothing", facts(e2, kmmv1beta1.NodeModuleStatus{}, readyNode(k1)), want{state: Absent}},
		{"rule 3: spec missing, status kernel equals node kernel: unload pod", facts(nil, loaded(Loaded, e1), readyNode(k1)), want{state: Unloading, create: contract.ActionUnload}},
		{"rule 3: spec missing, status kernel differs from node kernel: nothing to unload", facts(nil, loaded(Loaded, e1), readyNode(k2)), want{removed: true}},
		{"rule 4: spec differs from status, status kernel equals node kernel: one reload pod (issue 22), the ready label stays", facts(e1b, loaded(Loaded, e1), readyNode(k1)), want{state: Loading, create: contract.ActionReload, ready: true}},
		{"rule 4: spec differs, status kernel differs, spec kernel equals node kernel: load pod", facts(e2, loaded(Loaded, e1), readyNode(k2)), want{state: Loading, create: contract.ActionLoad}},
		{"rule 4: spec differs, both kernels differ from the node's: nothing", facts(e1b, loaded(Loaded, e1), readyNode(k2)), want{state: Absent}},
		{"rule 5: spec equals status, Ready newer than status: load pod", facts(e1, loaded(Loaded, e1), rebootedReady), want{state: Loading, create: contract.ActionLoad}},
		{"rule 5: spec equals status, Ready older than status: nothing", facts(e1, loaded(Loaded, e1), readyNode(k1)), want{state: Loaded, ready: true}},
		{"reboot: boot ID changed: load again", facts(e1, loaded(Loaded, e1), newBoot), want{state: Loading, create: contract.ActionLoad}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { check(t, tc.f, tc.want) })
	}
}

// TestStepWorkerOutcomes covers what a finished worker pod does to the pair.
func TestStepWorkerOutcomes(t *testing.T) {
	e1 := entry(k1, "r/m:v1", "")
	loading := kmmv1beta1.NodeModuleStatus{State: Loading, LastTransitionTime: metav1.NewTime(t0.Add(-time.Minute))}

	t.Run("load succeeded: Loaded, ready label, pod deleted, config and boot recorded", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *e1, Result: contract.Result{BootID: "b1", ImageDigest: "sha256:1"}}
		r := check(t, f, want{state: Loaded, delete: true, ready: true})
		if r.Status.Config == nil || r.Status.BootID != "b1" || r.Status.ImageDigest != "sha256:1" || r.Status.LastWorkerTime == nil {
			t.Fatalf("status = %+v", r.Status)
		}
	})
	t.Run("load succeeded in an earlier boot: stale, pod deleted, still Loading", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *e1, Result: contract.Result{BootID: "b0"}}
		check(t, f, want{state: Loading, delete: true})
	})
	t.Run("load failed: LoadBackOff, attempts counted, failed pod kept, requeue after back-off", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *e1, Result: contract.Result{Reason: "ImagePull", Message: "not found"}}
		r := check(t, f, want{state: LoadBackOff})
		if r.Status.Attempts != 1 || r.Plan.RequeueAfter != DefaultBackOff.Base {
			t.Fatalf("attempts %d requeue %v", r.Status.Attempts, r.Plan.RequeueAfter)
		}
	})
	t.Run("load failed while the node is NotReady: still recorded", func(t *testing.T) {
		f := facts(e1, loading, Node{KernelVersion: k1})
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *e1}
		check(t, f, want{state: LoadBackOff})
	})
	t.Run("back-off expired: Loading, old pod deleted first", func(t *testing.T) {
		st := kmmv1beta1.NodeModuleStatus{State: LoadBackOff, Attempts: 2, LastTransitionTime: metav1.NewTime(t0.Add(-DefaultBackOff.Delay(2)))}
		f := facts(e1, st, readyNode(k1))
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Attempt: 1, Entry: *e1}
		check(t, f, want{state: Loading, delete: true})
	})
	t.Run("back-off not over: wait", func(t *testing.T) {
		st := kmmv1beta1.NodeModuleStatus{State: LoadBackOff, Attempts: 2, LastTransitionTime: metav1.NewTime(t0.Add(-time.Second))}
		f := facts(e1, st, readyNode(k1))
		r := check(t, f, want{state: LoadBackOff})
		if r.Plan.RequeueAfter != DefaultBackOff.Delay(2)-time.Second {
			t.Fatalf("requeue %v", r.Plan.RequeueAfter)
		}
	})
	t.Run("spec fixed during back-off: retry at once", func(t *testing.T) {
		st := kmmv1beta1.NodeModuleStatus{State: LoadBackOff, Attempts: 1, LastTransitionTime: metav1.NewTime(t0)}
		f := facts(e1, st, readyNode(k1))
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *entry(k1, "r/m:broken", ""), EntryKnown: true}
		check(t, f, want{state: Loading, delete: true})
	})
	t.Run("failed pod whose config cannot be read: back-off holds (the retry storm)", func(t *testing.T) {
		st := kmmv1beta1.NodeModuleStatus{State: LoadBackOff, Attempts: 1, LastTransitionTime: metav1.NewTime(t0)}
		f := facts(e1, st, readyNode(k1))
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Attempt: 0}
		r := check(t, f, want{state: LoadBackOff})
		if r.Plan.RequeueAfter != DefaultBackOff.Base {
			t.Fatalf("requeue %v, want the back-off", r.Plan.RequeueAfter)
		}
	})
	t.Run("worker refused the config: terminal, no retry after the back-off", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *e1, EntryKnown: true, Result: contract.Result{Reason: "InvalidConfig", Message: "invalid config"}}
		r := check(t, f, want{state: LoadBackOff})
		if r.Status.Reason != ReasonInvalidConfig || r.Status.Transitions[0].Reason != ReasonInvalidConfig {
			t.Fatalf("reason %q, log %+v", r.Status.Reason, r.Status.Transitions)
		}
		f = facts(e1, *r.Status, readyNode(k1))
		f.Now = t0.Add(time.Hour)
		f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *e1, EntryKnown: true, Result: contract.Result{Reason: "InvalidConfig"}}
		r = check(t, f, want{state: LoadBackOff})
		if r.Plan.RequeueAfter != 0 || len(r.Fired) != 0 {
			t.Fatalf("a refused config was retried: %+v", r)
		}
		f.Spec = entry(k1, "r/m:v2", "")
		check(t, f, want{state: Loading, delete: true})
		// The failed pod is gone (deleted by hand): which config it had is unknown, so the pair
		// tries once more (at most one pod per such deletion).
		f.Spec, f.Worker = e1, Worker{}
		check(t, f, want{state: Loading, create: contract.ActionLoad})
	})
	t.Run("invalid spec config: no pod, LoadBackOff InvalidConfig, then a valid one loads at once", func(t *testing.T) {
		bad := entry(k1, "r/m:v1", "")
		bad.Config.Modprobe.FirmwarePath = "/"
		r := check(t, facts(bad, kmmv1beta1.NodeModuleStatus{}, readyNode(k1)), want{state: LoadBackOff})
		if r.Status.Reason != ReasonInvalidConfig || r.Status.Attempts != 1 || !strings.Contains(r.Status.Message, "firmwarePath") {
			t.Fatalf("status %+v", r.Status)
		}
		f := facts(bad, *r.Status, readyNode(k1))
		f.Now = t0.Add(time.Hour)
		check(t, f, want{state: LoadBackOff})
		f.Spec = e1
		check(t, f, want{state: Loading, create: contract.ActionLoad})
	})
	t.Run("pod refused by the API server: back-off, then retried", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		f.CreateRefused = &CreateRefusal{Action: contract.ActionLoad, Attempt: 0, Message: "metadata.annotations: Too long"}
		r := check(t, f, want{state: LoadBackOff})
		if r.Status.Reason != ReasonPodRejected || r.Plan.RequeueAfter != DefaultBackOff.Base {
			t.Fatalf("status %+v plan %+v", r.Status, r.Plan)
		}
		f = facts(e1, *r.Status, readyNode(k1))
		f.Now = t0.Add(DefaultBackOff.Base)
		f.CreateRefused = &CreateRefusal{Action: contract.ActionLoad, Attempt: 0}
		check(t, f, want{state: Loading, create: contract.ActionLoad})
	})
	t.Run("service account unreadable: no pod, back-off with the operator's reason, then retried", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		msg := `cannot read service account ns/loader for its imagePullSecrets: serviceaccounts "loader" is forbidden`
		f.CreateRefused = &CreateRefusal{Action: contract.ActionLoad, Attempt: 0, Reason: ReasonServiceAccountUnreadable, Message: msg}
		r := check(t, f, want{state: LoadBackOff})
		if r.Status.Reason != ReasonServiceAccountUnreadable || !strings.Contains(r.Status.Message, msg) || r.Status.Attempts != 1 ||
			r.Plan.RequeueAfter != DefaultBackOff.Base {
			t.Fatalf("status %+v plan %+v", r.Status, r.Plan)
		}
		f = facts(e1, *r.Status, readyNode(k1))
		f.Now = t0.Add(DefaultBackOff.Base)
		check(t, f, want{state: Loading, create: contract.ActionLoad})
	})
	t.Run("worker pod past the timeout: LoadBackOff, pod deleted; before it, a requeue at the timeout", func(t *testing.T) {
		f := facts(e1, loading, readyNode(k1))
		f.Worker = Worker{Phase: PodRunning, Action: contract.ActionLoad, Entry: *e1, EntryKnown: true, Created: t0.Add(-time.Minute)}
		r := check(t, f, want{state: Loading})
		if r.Plan.RequeueAfter != DefaultWorkerTimeout-time.Minute {
			t.Fatalf("requeue %v", r.Plan.RequeueAfter)
		}
		f.Worker.Created = t0.Add(-DefaultWorkerTimeout)
		r = check(t, f, want{state: LoadBackOff, delete: true})
		if r.Status.Reason != ReasonTimedOut || r.Status.Attempts != 1 {
			t.Fatalf("status %+v", r.Status)
		}
	})
	t.Run("worker pod past the timeout, spec removed meanwhile: LoadBackOff first, the rest once the pod's fate is known", func(t *testing.T) {
		f := facts(nil, loading, readyNode(k1))
		f.Worker = Worker{Phase: PodRunning, Action: contract.ActionLoad, Entry: *e1, EntryKnown: true, Created: t0.Add(-DefaultWorkerTimeout)}
		check(t, f, want{state: LoadBackOff, delete: true})
		// The deletion lost the race: the pod succeeded. The module is loaded, and then unloaded.
		st := loading
		st.State, st.Reason, st.Attempts = LoadBackOff, ReasonTimedOut, 1
		f = facts(nil, st, readyNode(k1))
		f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *e1, EntryKnown: true, Result: contract.Result{BootID: "b1"}}
		r := check(t, f, want{state: Unloading, delete: true}) // the unload pod comes once the load pod is gone
		if r.Fired[0].To != Loaded {
			t.Fatalf("transitions %+v: the late success must be recorded first", r.Fired)
		}
	})
	t.Run("unload succeeded, spec gone: entry removed", func(t *testing.T) {
		f := facts(nil, loaded(Unloading, e1), readyNode(k1))
		f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionUnload, Entry: *e1}
		check(t, f, want{removed: true})
	})
	// Found by the explorer (issue 19): the unload pod succeeds just as the reconcile that read it
	// Running past the timeout records WorkerTimedOut (its deletion then fails: the pod changed).
	// The spec comes back to the old config meanwhile. Nothing is loaded: the pair must not call
	// itself Loaded, it must load again.
	t.Run("unload pod timed out, then succeeded after all: the unload ends, even with the spec back", func(t *testing.T) {
		st := loaded(UnloadBackOff, e1)
		st.Reason, st.Attempts = ReasonTimedOut, 1
		f := facts(e1, st, readyNode(k1))
		f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionUnload, Attempt: 0, Entry: *e1, EntryKnown: true}
		r := check(t, f, want{state: Loading, delete: true})
		if got := r.Fired[0]; got.From != UnloadBackOff || got.Trigger != string(WorkerSucceeded) || got.To != Absent {
			t.Fatalf("first transition %+v, want UnloadBackOff --WorkerSucceeded--> Absent", got)
		}
		if r.Status.Config != nil || r.Status.Attempts != 0 {
			t.Fatalf("status %+v: the unloaded config must be forgotten", r.Status)
		}
	})
}

// TestStepOrderedUpgrade follows seed 002 through the pair's states.
func TestStepOrderedUpgrade(t *testing.T) {
	v1, v2 := entry(k1, "r/m:v1", "v1"), entry(k1, "r/m:v2", "v2")
	node := readyNode(k1)
	node.UpgradeTarget = "v2"

	f := facts(v1, loaded(Loaded, v1), node)
	f.DevicePluginRunning = true
	check(t, f, want{state: DevicePluginDraining})

	f = facts(nil, loaded(DevicePluginDraining, v1), node)
	f.DevicePluginRunning = true
	check(t, f, want{state: DevicePluginDraining}) // no unload while the device plugin runs

	f = facts(nil, loaded(DevicePluginDraining, v1), node)
	check(t, f, want{state: Unloading, create: contract.ActionUnload})

	f = facts(nil, loaded(Unloading, v1), node)
	f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionUnload, Entry: *v1}
	check(t, f, want{state: Upgrading, delete: true})

	f = facts(v2, kmmv1beta1.NodeModuleStatus{State: Upgrading, LastTransitionTime: metav1.NewTime(t0)}, node)
	check(t, f, want{state: Loading, create: contract.ActionLoad})

	loading := kmmv1beta1.NodeModuleStatus{State: Loading, LastTransitionTime: metav1.NewTime(t0)}
	f = facts(v2, loading, node)
	f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *v2, Result: contract.Result{BootID: "b1"}}
	r := check(t, f, want{state: Loaded, delete: true, ready: true})
	if r.Plan.VersionReady != "v2" {
		t.Fatalf("version.ready = %q, want v2", r.Plan.VersionReady)
	}
}

// TestUpgradingWaitsForTheNewSpecEntry: the worker-pod label at the target with no entry yet is
// normal for a moment (the Module→NMC controller is about to write it); after the grace it is not.
func TestUpgradingWaitsForTheNewSpecEntry(t *testing.T) {
	node := readyNode(k1)
	node.UpgradeTarget, node.WorkerPodVersion = "v2", "v2"
	upgrading := kmmv1beta1.NodeModuleStatus{State: Upgrading, LastTransitionTime: metav1.NewTime(t0.Add(-time.Second))}
	r := check(t, facts(nil, upgrading, node), want{state: Upgrading})
	if r.Plan.RequeueAfter != UpgradeSpecGrace-time.Second {
		t.Fatalf("requeue %v", r.Plan.RequeueAfter)
	}
	upgrading.LastTransitionTime = metav1.NewTime(t0.Add(-UpgradeSpecGrace))
	check(t, facts(nil, upgrading, node), want{removed: true})
}

func TestStepDevicePluginBlocksUnload(t *testing.T) {
	e1 := entry(k1, "r/m:v1", "")
	f := facts(nil, loaded(Loaded, e1), readyNode(k1))
	f.DevicePluginRunning = true
	check(t, f, want{state: DevicePluginDraining})
	f = facts(nil, loaded(Unloading, e1), readyNode(k1))
	f.DevicePluginRunning = true
	r := check(t, f, want{state: Unloading})
	if r.Plan.Waiting == "" {
		t.Fatal("no waiting reason while the device plugin pod blocks the unload")
	}
}

func TestTransitionLogIsBoundedAndReplays(t *testing.T) {
	e1 := entry(k1, "r/m:v1", "")
	st := kmmv1beta1.NodeModuleStatus{}
	boot := 0
	for i := range 3 * kmmv1beta1.MaxTransitionLog {
		node := readyNode(k1)
		node.BootID = string(rune('a' + boot))
		f := facts(e1, st, node)
		f.Now = t0.Add(time.Duration(i) * time.Minute)
		switch st.State {
		case Loading:
			f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *e1, Result: contract.Result{BootID: node.BootID}}
		case Loaded:
			boot++
			f.Node.BootID = string(rune('a' + boot))
		}
		r := Step(f)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		st = *r.Status
	}
	if len(st.Transitions) != kmmv1beta1.MaxTransitionLog {
		t.Fatalf("log has %d entries, want %d", len(st.Transitions), kmmv1beta1.MaxTransitionLog)
	}
	if got, err := replay(st.Transitions); err != nil || got != st.State {
		t.Fatalf("replay = %s, %v; want %s", got, err, st.State)
	}
}

func TestUnpermittedTriggerIsAnError(t *testing.T) {
	f := facts(nil, kmmv1beta1.NodeModuleStatus{}, readyNode(k1))
	if _, err := fire(Absent, WorkerSucceeded, &f); !errors.Is(err, ErrNotPermitted) {
		t.Fatalf("fire(Absent, WorkerSucceeded) = %v, want ErrNotPermitted", err)
	}
}

func TestBackOffDelay(t *testing.T) {
	b := BackOff{Base: time.Second, Max: 5 * time.Second}
	for attempts, want := range map[int32]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 30: 5 * time.Second} {
		if got := b.Delay(attempts); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempts, got, want)
		}
	}
}
