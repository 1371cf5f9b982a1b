package image

import (
	"strings"
	"testing"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func entry(s State, run, attempts int32, since time.Duration) kmmv1beta1.ModuleImageState {
	return kmmv1beta1.ModuleImageState{Image: "r/k:1", State: s, Run: run, Attempts: attempts, LastTransitionTime: timeP(t0.Add(-since))}
}

func answer(a Answer) *RegistryAnswer {
	return &RegistryAnswer{Answer: a, Message: "dial tcp: refused"}
}

func TestStep(t *testing.T) {
	build, sign, both := Recipe{Build: true}, Recipe{Sign: true}, Recipe{Build: true, Sign: true}
	gen2 := int64(2)
	cases := []struct {
		name       string
		f          Facts
		wantState  State
		wantFired  string // triggers, comma-separated
		wantPlan   Plan
		wantStatus kmmv1beta1.ImageState
		check      func(t *testing.T, r Result)
	}{
		{name: "a new image is checked first", f: Facts{Recipe: build},
			wantState: Checking, wantPlan: Plan{CheckRegistry: true}},
		{name: "an entry upstream wrote is checked again", f: Facts{Recipe: build, Status: kmmv1beta1.ModuleImageState{Image: "r/k:1", Status: kmmv1beta1.ImageExists}},
			wantState: Checking, wantPlan: Plan{CheckRegistry: true}},
		{name: "found: Present, nothing built", f: Facts{Recipe: both, Status: entry(Checking, 0, 0, 0), Registry: answer(AnswerPresent)},
			wantState: Present, wantFired: "ImageFound", wantStatus: kmmv1beta1.ImageExists,
			check: func(t *testing.T, r Result) {
				if !MayLoad(&r.Status) || r.Status.LastCheckTime == nil {
					t.Error("a Present image must open the gate and record its check")
				}
			}},
		{name: "missing with a build: one build pod, run 1", f: Facts{Recipe: build, Status: entry(Checking, 0, 0, 0), Registry: answer(AnswerMissing)},
			wantState: Building, wantFired: "ImageNotFound", wantPlan: Plan{CreatePod: &PodIntent{BuildPod, 1}}, wantStatus: kmmv1beta1.ImageNeedsBuilding},
		{name: "missing with a sign only: one sign pod", f: Facts{Recipe: sign, Status: entry(Checking, 0, 0, 0), Registry: answer(AnswerMissing)},
			wantState: Signing, wantFired: "ImageNotFound", wantPlan: Plan{CreatePod: &PodIntent{SignPod, 1}}, wantStatus: kmmv1beta1.ImageNeedsSigning},
		{name: "missing without a recipe: waits, looks again in a minute", f: Facts{Status: entry(Checking, 0, 0, 0), Registry: answer(AnswerMissing)},
			wantState: Missing, wantFired: "ImageNotFound", wantStatus: kmmv1beta1.ImageDoesNotExist,
			wantPlan: Plan{RequeueAfter: MissingPoll, Waiting: "the image is not in its registry and nothing can build or sign it"}},
		{name: "no answer: stays, counts, backs off", f: Facts{Recipe: build, Status: entry(Checking, 0, 0, 0), Registry: answer(AnswerError)},
			wantState: Checking, wantPlan: Plan{RequeueAfter: 10 * time.Second},
			check: func(t *testing.T, r Result) {
				if r.Status.Attempts != 1 || r.Status.Reason != ReasonRegistryUnreachable || !strings.Contains(r.Status.Message, "refused") {
					t.Errorf("status %+v", r.Status)
				}
			}},
		{name: "building: its pod runs, nothing else", f: Facts{Recipe: build, Status: entry(Building, 1, 0, time.Minute), BuildPods: []Pod{{Run: 1, Phase: PodRunning}}},
			wantState: Building, wantStatus: kmmv1beta1.ImageNeedsBuilding},
		{name: "built, to be signed: the build pod goes, a sign pod comes", f: Facts{Recipe: both, Status: entry(Building, 1, 0, time.Minute), BuildPods: []Pod{{Run: 1, Phase: PodSucceeded}}},
			wantState: Signing, wantFired: "BuildSucceeded", wantStatus: kmmv1beta1.ImageNeedsSigning,
			wantPlan: Plan{CreatePod: &PodIntent{SignPod, 2}, DeletePods: []PodRef{{BuildPod, 1}}}},
		{name: "built, no sign: the push is verified", f: Facts{Recipe: build, Status: entry(Building, 1, 0, time.Minute), BuildPods: []Pod{{Run: 1, Phase: PodSucceeded}}},
			wantState: Checking, wantFired: "BuildSucceeded", wantPlan: Plan{CheckRegistry: true, DeletePods: []PodRef{{BuildPod, 1}}}},
		{name: "an older run's pod outcome does not count", f: Facts{Recipe: build, Status: entry(Building, 2, 1, time.Minute), BuildPods: []Pod{{Run: 1, Phase: PodFailed}}},
			wantState: Building, wantStatus: kmmv1beta1.ImageNeedsBuilding,
			wantPlan: Plan{CreatePod: &PodIntent{BuildPod, 2}, DeletePods: []PodRef{{BuildPod, 1}}}},
		{name: "build failed: back-off, the pod kept with its log", f: Facts{Recipe: build, Status: entry(Building, 1, 0, time.Minute), BuildPods: []Pod{{Run: 1, Phase: PodFailed, Message: "gcc: error"}}},
			wantState: BuildBackOff, wantFired: "BuildFailed", wantStatus: kmmv1beta1.ImageNeedsBuilding,
			wantPlan: Plan{RequeueAfter: 10 * time.Second, Waiting: "attempt 1 failed: retried after a back-off"},
			check: func(t *testing.T, r Result) {
				if r.Status.Attempts != 1 || !strings.Contains(r.Status.Message, "gcc: error") {
					t.Errorf("status %+v", r.Status)
				}
			}},
		{name: "build back-off over: checked again, not rebuilt blindly", f: Facts{Recipe: build, Status: entry(BuildBackOff, 1, 1, 10*time.Second), BuildPods: []Pod{{Run: 1, Phase: PodFailed}}},
			wantState: Checking, wantFired: "BackOffExpired", wantPlan: Plan{CheckRegistry: true}},
		{name: "third failure: 40 s", f: Facts{Recipe: build, Status: entry(BuildBackOff, 3, 3, 30*time.Second)},
			wantState: BuildBackOff, wantStatus: kmmv1beta1.ImageNeedsBuilding, wantPlan: Plan{RequeueAfter: 10 * time.Second, Waiting: "attempt 3 failed: retried after a back-off"}},
		{name: "sign failed: back-off", f: Facts{Recipe: both, Status: entry(Signing, 2, 0, time.Minute), SignPods: []Pod{{Run: 2, Phase: PodFailed, Message: "key does not match"}}},
			wantState: SignBackOff, wantFired: "SignFailed", wantStatus: kmmv1beta1.ImageNeedsSigning,
			wantPlan: Plan{RequeueAfter: 10 * time.Second, Waiting: "attempt 1 failed: retried after a back-off"}},
		{name: "sign back-off over: the sign again, never a build", f: Facts{Recipe: both, Status: entry(SignBackOff, 2, 1, time.Minute), SignPods: []Pod{{Run: 2, Phase: PodFailed}}},
			wantState: Signing, wantFired: "BackOffExpired", wantStatus: kmmv1beta1.ImageNeedsSigning,
			wantPlan: Plan{CreatePod: &PodIntent{SignPod, 3}, DeletePods: []PodRef{{SignPod, 2}}}},
		{name: "signed: the push is verified", f: Facts{Recipe: both, Status: entry(Signing, 2, 0, time.Minute), SignPods: []Pod{{Run: 2, Phase: PodSucceeded}}},
			wantState: Checking, wantFired: "SignSucceeded", wantPlan: Plan{CheckRegistry: true, DeletePods: []PodRef{{SignPod, 2}}}},
		{name: "rebuild trigger on a Present image: checked again", f: Facts{Recipe: build, Generation: &gen2, Status: entry(Present, 1, 0, time.Hour)},
			wantState: Checking, wantFired: "RebuildRequested", wantPlan: Plan{CheckRegistry: true},
			check: func(t *testing.T, r Result) {
				if g := r.Status.RebuildTriggerGeneration; g == nil || *g != 2 || MayLoad(&r.Status) {
					t.Errorf("status %+v", r.Status)
				}
			}},
		{name: "rebuild trigger during a build: the build finishes first", f: Facts{Recipe: build, Generation: &gen2, Status: entry(Building, 1, 0, time.Minute), BuildPods: []Pod{{Run: 1, Phase: PodRunning}}},
			wantState: Building, wantStatus: kmmv1beta1.ImageNeedsBuilding},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.Now, tc.f.Image = t0, "r/k:1"
			r := Step(tc.f)
			var fired []string
			for _, tr := range r.Fired {
				fired = append(fired, tr.Trigger)
			}
			if r.Status.State != tc.wantState || strings.Join(fired, ",") != tc.wantFired || r.Status.Status != tc.wantStatus {
				t.Fatalf("state %s fired %v status %q; want %s, %q, %q", r.Status.State, fired, r.Status.Status, tc.wantState, tc.wantFired, tc.wantStatus)
			}
			if !planEqual(r.Plan, tc.wantPlan) {
				t.Errorf("plan %+v (create %+v), want %+v (create %+v)", r.Plan, r.Plan.CreatePod, tc.wantPlan, tc.wantPlan.CreatePod)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func planEqual(a, b Plan) bool {
	if (a.CreatePod == nil) != (b.CreatePod == nil) || (a.CreatePod != nil && *a.CreatePod != *b.CreatePod) {
		return false
	}
	if len(a.DeletePods) != len(b.DeletePods) {
		return false
	}
	for i := range a.DeletePods {
		if a.DeletePods[i] != b.DeletePods[i] {
			return false
		}
	}
	return a.CheckRegistry == b.CheckRegistry && a.RequeueAfter == b.RequeueAfter && a.Waiting == b.Waiting
}

func TestBackOff(t *testing.T) {
	for attempts, want := range map[int32]time.Duration{0: 0, 1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 6: 5 * time.Minute, 100: 5 * time.Minute} {
		if got := backOff(attempts); got != want {
			t.Errorf("backOff(%d) = %v, want %v", attempts, got, want)
		}
	}
}

func TestTransitionLogIsBounded(t *testing.T) {
	st := entry(Present, 0, 0, time.Hour)
	for i := range 40 {
		g := int64(i)
		r := Step(Facts{Now: t0.Add(time.Duration(i) * time.Minute), Image: "r/k:1", Generation: &g, Status: st, Registry: answer(AnswerPresent)})
		st = r.Status
	}
	if n := len(st.Transitions); n != kmmv1beta1.MaxImageTransitions {
		t.Fatalf("%d transitions kept, want %d", n, kmmv1beta1.MaxImageTransitions)
	}
	if last := st.Transitions[len(st.Transitions)-1]; last.Time.Time != t0.Add(39*time.Minute) {
		t.Fatalf("the newest transition is not last: %+v", last)
	}
}

func TestMayLoad(t *testing.T) {
	for _, s := range States {
		st := kmmv1beta1.ModuleImageState{State: s}
		if MayLoad(&st) != (s == Present) {
			t.Errorf("MayLoad(%s) = %v", s, s != Present)
		}
	}
	if MayLoad(nil) {
		t.Error("MayLoad(nil) = true: a pair with no image record loaded")
	}
	if MayLoad(&kmmv1beta1.ModuleImageState{Status: kmmv1beta1.ImageExists}) {
		t.Error("an entry upstream wrote opens the gate before kmm checked it")
	}
}
