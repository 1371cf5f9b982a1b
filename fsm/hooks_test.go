package fsm

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

func hooks(tag string) *kmmv1beta1.ModuleHooks {
	h := func(arg string) *kmmv1beta1.ModuleHook {
		return &kmmv1beta1.ModuleHook{Image: "reg/hooks:" + tag, Args: []string{arg}}
	}
	return &kmmv1beta1.ModuleHooks{PostLoad: h("post-load"), PreUnload: h("pre-unload")}
}

func hooked(kernel, image string) *kmmv1beta1.NodeModuleSpec {
	e := entry(kernel, image, "")
	e.Hooks = hooks("1")
	return e
}

// TestPostLoadHookFailureKeepsTheModuleRecorded: a load pod whose worker loaded the module and
// whose postLoad hook failed backs off with the hook's reason and message, records the config as
// loaded (it is in the kernel: a later unload must take it out) and gives no ready label.
func TestPostLoadHookFailureKeepsTheModuleRecorded(t *testing.T) {
	spec := hooked(k1, "reg/m:1")
	st := kmmv1beta1.NodeModuleStatus{State: Loading, LastTransitionTime: metav1.NewTime(t0.Add(-time.Minute))}
	f := facts(spec, st, readyNode(k1))
	f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *spec, EntryKnown: true,
		Result: contract.Result{Outcome: contract.OutcomeFailed, BootID: "b1", Reason: ReasonPostLoadHookFailed, Message: "the post-load hook exited 3: no device"}}
	r := check(t, f, want{state: LoadBackOff})
	switch {
	case r.Status.Reason != ReasonPostLoadHookFailed || r.Status.Message != "the post-load hook exited 3: no device":
		t.Errorf("reason %q message %q", r.Status.Reason, r.Status.Message)
	case r.Status.Config == nil || r.Status.Config.ContainerImage != "reg/m:1" || r.Status.BootID != "b1":
		t.Errorf("the loaded config is not recorded: %+v", r.Status)
	case r.Status.Attempts != 1 || r.Plan.RequeueAfter != DefaultBackOff.Delay(1):
		t.Errorf("attempts %d requeue %v, want 1 and the back-off", r.Status.Attempts, r.Plan.RequeueAfter)
	case r.Status.Hooks == nil || r.Status.Hooks.PreUnload == nil:
		t.Errorf("the hooks of the loaded config are not recorded: %+v", r.Status.Hooks)
	case len(r.Fired) != 1 || r.Fired[0].Trigger != string(HookFailed):
		t.Errorf("fired %v, want HookFailed", r.Fired)
	}

	// After the back-off, the load pod (worker and hook) runs again; the kernel keeps the module.
	f = facts(spec, *r.Status, readyNode(k1))
	f.Now = t0.Add(DefaultBackOff.Delay(1))
	r = check(t, f, want{state: Loading, create: contract.ActionLoad})
	if h := r.Plan.CreateWorker.Entry.Hooks; h == nil || h.PostLoad == nil {
		t.Errorf("the retry's load pod has no postLoad hook: %+v", h)
	}

	// Removed meanwhile: the recorded module is unloaded, preUnload hook first, not forgotten.
	f = facts(nil, *r.Status, readyNode(k1))
	r = check(t, f, want{state: Unloading, create: contract.ActionUnload})
	if h := r.Plan.CreateWorker.Entry.Hooks; h == nil || h.PreUnload == nil || h.PreUnload.Image != "reg/hooks:1" {
		t.Errorf("the unload pod of a removed spec entry has no preUnload hook: %+v", h)
	}
}

// TestPostLoadHookFailureOfAnotherBootLoadsNothing: a hook failure reported in an earlier boot is a
// plain failure: nothing is recorded as loaded.
func TestPostLoadHookFailureOfAnotherBootLoadsNothing(t *testing.T) {
	spec := hooked(k1, "reg/m:1")
	f := facts(spec, kmmv1beta1.NodeModuleStatus{State: Loading}, readyNode(k1))
	f.Worker = Worker{Phase: PodFailed, Action: contract.ActionLoad, Entry: *spec, EntryKnown: true,
		Result: contract.Result{Outcome: contract.OutcomeFailed, BootID: "b0", Reason: ReasonPostLoadHookFailed}}
	r := check(t, f, want{state: LoadBackOff})
	if r.Status.Config != nil {
		t.Errorf("a load of another boot is recorded: %+v", r.Status.Config)
	}
}

// TestPreUnloadHookFailureNeverUnloads: a failed preUnload hook backs off with its reason, the
// module recorded as loaded; after the back-off the unload pod runs the (current) hook again.
func TestPreUnloadHookFailureNeverUnloads(t *testing.T) {
	spec := hooked(k1, "reg/m:1")
	st := loaded(Unloading, spec)
	st.Hooks = hooks("1")
	f := facts(nil, st, readyNode(k1))
	f.Worker = Worker{Phase: PodFailed, Action: contract.ActionUnload, Entry: *spec, EntryKnown: true,
		Result: contract.Result{Outcome: contract.OutcomeFailed, Reason: ReasonPreUnloadHookFailed, Message: "the pre-unload hook exited 1: device busy"}}
	r := check(t, f, want{state: UnloadBackOff})
	switch {
	case r.Status.Reason != ReasonPreUnloadHookFailed || r.Status.Message != "the pre-unload hook exited 1: device busy":
		t.Errorf("reason %q message %q", r.Status.Reason, r.Status.Message)
	case r.Status.Config == nil || r.Status.Attempts != 1:
		t.Errorf("config %v attempts %d: the module must stay recorded as loaded", r.Status.Config, r.Status.Attempts)
	}
	// The user fixed the hook (the spec entry, an image bump, names a new one): the retry after
	// the back-off runs the new hook.
	fixed := hooked(k1, "reg/m:2")
	fixed.Hooks = hooks("2")
	f = facts(fixed, *r.Status, readyNode(k1))
	f.Now = t0.Add(DefaultBackOff.Delay(1))
	r = check(t, f, want{state: Unloading, create: contract.ActionUnload})
	if h := r.Plan.CreateWorker.Entry.Hooks; h == nil || h.PreUnload.Image != "reg/hooks:2" {
		t.Errorf("the retry does not run the fixed preUnload hook: %+v", h)
	}
}

// TestUnloadRunsTheSpecEntrysHook: while a spec entry exists, the unload runs its preUnload hook
// (a fixed hook is the next attempt's), and the record follows it.
func TestUnloadRunsTheSpecEntrysHook(t *testing.T) {
	old := hooked(k1, "reg/m:1")
	st := loaded(Loaded, old)
	st.Hooks = hooks("1")
	spec := hooked(k1, "reg/m:2")
	spec.Hooks = hooks("2")
	f := facts(spec, st, readyNode(k1))
	r := check(t, f, want{state: Unloading, create: contract.ActionUnload})
	if h := r.Plan.CreateWorker.Entry.Hooks; h == nil || h.PreUnload.Image != "reg/hooks:2" || r.Status.Hooks.PreUnload.Image != "reg/hooks:2" {
		t.Errorf("unload hooks %+v, recorded %+v: want the spec entry's", h, r.Status.Hooks)
	}
}

// TestHookedModuleNeverReloads: an image bump of a Module with hooks is an unload pod (preUnload)
// then a load pod (postLoad), never one reload pod, which would run neither.
func TestHookedModuleNeverReloads(t *testing.T) {
	st := loaded(Loaded, hooked(k1, "reg/m:1"))
	st.Hooks = hooks("1")
	r := check(t, facts(hooked(k1, "reg/m:2"), st, readyNode(k1)), want{state: Unloading, create: contract.ActionUnload})
	if r.Plan.CreateWorker.Entry.Config.ContainerImage != "reg/m:1" {
		t.Errorf("unloads %s", r.Plan.CreateWorker.Entry.Config.ContainerImage)
	}
}
