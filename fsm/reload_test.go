package fsm

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kmm-project/kmm/contract"
)

// TestReloadIsChosenOnlyWhenNothingMustGoBetween: an image bump of a Module without a version, on
// the kernel the node runs, with nothing to drain, is one reload worker; a device plugin pod, a
// version, another service account or pull secret, or an invalid new config keep the unload and
// the load apart (or drain first).
func TestReloadIsChosenOnlyWhenNothingMustGoBetween(t *testing.T) {
	e1, e1b := entry(k1, "r/m:v1", ""), entry(k1, "r/m:v1b", "")
	v1, v2 := entry(k1, "r/m:v1", "1"), entry(k1, "r/m:v2", "1")
	secret := entry(k1, "r/m:v1b", "")
	secret.ImageRepoSecret = &corev1.LocalObjectReference{Name: "pull"}
	invalid := entry(k1, "r/m:v1b", "")
	invalid.Config.Modprobe.FirmwarePath = "/"
	withDP := facts(e1b, loaded(Loaded, e1), readyNode(k1))
	withDP.DevicePluginRunning, withDP.DevicePluginConfigured = true, true
	dpConfigured := facts(e1b, loaded(Loaded, e1), readyNode(k1))
	dpConfigured.DevicePluginConfigured = true

	cases := []struct {
		name string
		f    Facts
		want want
	}{
		{"image bump: reload, the ready label stays", facts(e1b, loaded(Loaded, e1), readyNode(k1)), want{state: Loading, create: contract.ActionReload, ready: true}},
		{"image bump with a device plugin configured (not running here): reload, the ready label goes", dpConfigured, want{state: Loading, create: contract.ActionReload}},
		{"image bump with the device plugin pod running: drain it first (invariant 6)", withDP, want{state: DevicePluginDraining}},
		{"a versioned config changes: unload then load (seed 002)", facts(v2, loaded(Loaded, v1), readyNode(k1)), want{state: Unloading, create: contract.ActionUnload}},
		{"another pull secret: the pod cannot serve both halves", facts(secret, loaded(Loaded, e1), readyNode(k1)), want{state: Unloading, create: contract.ActionUnload}},
		{"a new config no worker accepts: unload, then fail the load", facts(invalid, loaded(Loaded, e1), readyNode(k1)), want{state: Unloading, create: contract.ActionUnload}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := check(t, tc.f, tc.want)
			if w := r.Plan.CreateWorker; w != nil && w.Action == contract.ActionReload {
				if w.Previous == nil || w.Previous.ContainerImage != e1.Config.ContainerImage || w.Entry.Config.ContainerImage != e1b.Config.ContainerImage {
					t.Errorf("reload intent unloads %v and loads %s, want %s then %s", w.Previous, w.Entry.Config.ContainerImage, e1.Config.ContainerImage, e1b.Config.ContainerImage)
				}
			}
		})
	}
}

// reloading is a pair whose reload pod (attempt 0) finished with phase and result.
func reloading(phase WorkerPhase, res contract.Result) Facts {
	e1, e1b := entry(k1, "r/m:v1", ""), entry(k1, "r/m:v1b", "")
	f := facts(e1b, loaded(Loading, e1), readyNode(k1))
	f.Worker = Worker{Phase: phase, Action: contract.ActionReload, Entry: *e1b, EntryKnown: true, Result: res}
	return f
}

// TestReloadOutcomes: a reload that succeeded records the new config; one whose unload half failed
// keeps the old config recorded (it is still loaded) and backs off as an unload; one whose load half
// failed records nothing loaded and backs off as a load. A timed-out reload is retried as a reload
// after the back-off, and its late success still counts.
func TestReloadOutcomes(t *testing.T) {
	t.Run("succeeded", func(t *testing.T) {
		r := check(t, reloading(PodSucceeded, contract.Result{BootID: "b1", ImageDigest: "sha256:new"}), want{state: Loaded, delete: true, ready: true})
		if r.Status.Config.ContainerImage != "r/m:v1b" || r.Status.ImageDigest != "sha256:new" || r.Status.Attempts != 0 {
			t.Errorf("recorded %+v", r.Status)
		}
	})
	t.Run("unload half failed: the old config stays recorded, UnloadBackOff, reason and message", func(t *testing.T) {
		r := check(t, reloading(PodFailed, contract.Result{BootID: "b1", Reason: "Busy", Message: "module m is in use", FailedStep: "unload"}), want{state: UnloadBackOff})
		if r.Status.Config == nil || r.Status.Config.ContainerImage != "r/m:v1" || r.Status.Reason != "Busy" || !strings.HasSuffix(r.Status.Message, "stays loaded (its unload failed or did not run): module m is in use") || r.Status.Attempts != 1 {
			t.Errorf("status %+v", r.Status)
		}
		if len(r.Fired) != 1 || !IsFailure(Trigger(r.Fired[0].Trigger)) {
			t.Errorf("fired %v, want one failure (one Warning Event)", r.Fired)
		}
		if r.Plan.RequeueAfter != DefaultBackOff.Delay(1) {
			t.Errorf("requeue after %v, want the back-off %v", r.Plan.RequeueAfter, DefaultBackOff.Delay(1))
		}
	})
	t.Run("a reload pod that ended without a result: the old config may still be loaded", func(t *testing.T) {
		check(t, reloading(PodFailed, contract.Result{Reason: "Other", Message: "Evicted"}), want{state: UnloadBackOff})
	})
	t.Run("load half failed: nothing recorded as loaded, LoadBackOff", func(t *testing.T) {
		r := check(t, reloading(PodFailed, contract.Result{BootID: "b1", Reason: "NotFound", Message: "not found", FailedStep: contract.StepLoad}), want{state: LoadBackOff})
		if r.Status.Config != nil || r.Status.Reason != "NotFound" || r.Status.Attempts != 1 {
			t.Errorf("status %+v", r.Status)
		}
		// After the back-off, a plain load (nothing to unload any more).
		f := facts(entry(k1, "r/m:v1b", ""), *r.Status, readyNode(k1))
		f.Worker = reloading(PodFailed, contract.Result{FailedStep: contract.StepLoad}).Worker
		f.Worker.Attempt = 0
		f.Now = t0.Add(DefaultBackOff.Delay(1))
		check(t, f, want{state: Loading, delete: true})
		f.Worker = Worker{}
		check(t, f, want{state: Loading, create: contract.ActionLoad})
	})
	t.Run("timed out, then retried as a reload; a late success counts", func(t *testing.T) {
		f := reloading(PodRunning, contract.Result{})
		f.Worker.Created = t0.Add(-DefaultWorkerTimeout)
		r := check(t, f, want{state: LoadBackOff, delete: true})
		if r.Status.Config == nil || r.Status.Config.ContainerImage != "r/m:v1" {
			t.Fatalf("a timed-out reload forgot the old config: %+v", r.Status)
		}
		late := facts(entry(k1, "r/m:v1b", ""), *r.Status, readyNode(k1))
		late.Worker = reloading(PodSucceeded, contract.Result{BootID: "b1"}).Worker
		check(t, late, want{state: Loaded, delete: true, ready: true})
		// The timed-out reload ends after all, its unload half done and its load failed: the
		// record of the old config goes (the explorer found it kept, and later taken as Loaded).
		lateFail := facts(entry(k1, "r/m:v1", ""), *r.Status, readyNode(k1))
		lateFail.Worker = reloading(PodFailed, contract.Result{BootID: "b1", Reason: "NotFound", FailedStep: contract.StepLoad}).Worker
		// (The spec went back to the old config meanwhile: it loads at once, the failed config
		// having been replaced.)
		lf := check(t, lateFail, want{state: Loading, delete: true})
		if lf.Status.Config != nil || lf.Status.Attempts != r.Status.Attempts || len(lf.Fired) != 2 || lf.Fired[0].Trigger != string(WorkerFailed) {
			t.Errorf("after a late load-half failure: config %v attempts %d fired %v, want none, %d, WorkerFailed then SpecChanged", lf.Status.Config, lf.Status.Attempts, lf.Fired, r.Status.Attempts)
		}
		retry := facts(entry(k1, "r/m:v1b", ""), *r.Status, readyNode(k1))
		retry.Now = t0.Add(DefaultBackOff.Delay(1))
		check(t, retry, want{state: Loading, create: contract.ActionReload, ready: true})
	})
	t.Run("a device plugin pod appears before the reload pod is made: drain", func(t *testing.T) {
		f := reloading(PodNone, contract.Result{})
		f.Worker, f.DevicePluginRunning = Worker{}, true
		check(t, f, want{state: DevicePluginDraining})
	})
	t.Run("the tolerations the API server adds to every pod (recorded from the admitted pod) do not count: reload", func(t *testing.T) {
		f := facts(entry(k1, "r/m:v1b", ""), loaded(Loaded, entry(k1, "r/m:v1", "")), readyNode(k1))
		for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
			f.Status.Tolerations = append(f.Status.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(300))})
		}
		check(t, f, want{state: Loading, create: contract.ActionReload, ready: true})
	})
	t.Run("tolerations differ: unload then load", func(t *testing.T) {
		f := facts(entry(k1, "r/m:v1b", ""), loaded(Loaded, entry(k1, "r/m:v1", "")), readyNode(k1))
		f.Spec.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, TolerationSeconds: ptr.To(int64(1))}}
		check(t, f, want{state: Unloading, create: contract.ActionUnload})
	})
}
