package image

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// The model: one (Module, image) in a simulated cluster — a registry holding the image (and the
// unsigned image a sign reads), build and sign pods, the Module's rebuild trigger, a clock — driven
// by the machine under test the way the image controller will drive it: gather the facts, Step,
// ask the registry when the plan says so and Step again with the answer, then carry out the plan.
// Pods are a plain list (as with generated names): at most one per kind at a time must come from
// the machine, not from the API server's refusal of a second pod of one name.

// event is one thing that happens in the world; a reconcile follows each.
type event int

const (
	evReconcile event = iota
	evTick
	evBuildOK
	evBuildFail
	evBuildLostPush
	evSignOK
	evSignFail
	evBumpGeneration
	evWipeRegistry
	evExternalPush
	evRegistryFlaps
	evRecipeChanges
	numEvents
)

var eventNames = [...]string{"reconcile", "tick", "build succeeds", "build fails", "build succeeds, push lost",
	"sign succeeds", "sign fails", "imageRebuildTriggerGeneration bumped", "registry wiped", "image pushed by CI", "registry goes down/up", "the Module's recipe changes"}

func (e event) String() string { return eventNames[e] }

type simPod struct {
	kind  PodKind
	run   int32
	phase PodPhase
}

// world is the simulated cluster around one image, and what the properties need to remember.
type world struct {
	m        *Machine
	gate     func(*kmmv1beta1.ModuleImageState) bool
	recipe   Recipe
	final    bool // the image is in the registry
	unsigned bool // the unsigned image a sign reads is in the registry
	pods     []simPod
	gen      *int64
	now      time.Time
	down     bool
	entry    kmmv1beta1.ModuleImageState
	requeue  time.Duration

	everFinal         bool   // the image has been in the registry at some time
	lastAnswer        Answer // the last registry answer the machine consumed
	missingSinceBuild bool   // a Missing answer was consumed since the last build run started
	signFailed        bool   // a sign failed, and no sign succeeded since
	signFailedFor     *int64 // the rebuild trigger generation the failed sign worked for
	trace             []string
}

func newWorld(m *Machine, gate func(*kmmv1beta1.ModuleImageState) bool, r Recipe) *world {
	return &world{m: m, gate: gate, recipe: r, unsigned: r.Sign && !r.Build,
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (w *world) clone() *world {
	c := *w
	c.entry = *w.entry.DeepCopy()
	c.pods = append([]simPod(nil), w.pods...)
	c.gen = copyGen(w.gen)
	c.signFailedFor = copyGen(w.signFailedFor)
	c.trace = append([]string(nil), w.trace...)
	return &c
}

func (w *world) facts() Facts {
	f := Facts{Now: w.now, Image: "reg.example.com/kmod:6.1", Recipe: w.recipe, Generation: copyGen(w.gen), Status: *w.entry.DeepCopy()}
	for _, p := range w.pods {
		pod := Pod{Run: p.run, Phase: p.phase, Message: "exit 1"}
		if p.kind == BuildPod {
			f.BuildPods = append(f.BuildPods, pod)
		} else {
			f.SignPods = append(f.SignPods, pod)
		}
	}
	return f
}

// apply makes e happen, then reconciles; it returns the first property the step broke ("" if none).
func (w *world) apply(e event) string {
	w.trace = append(w.trace, e.String())
	switch e {
	case evTick:
		d := w.requeue
		if d <= 0 {
			d = time.Minute
		}
		w.now = w.now.Add(d)
	case evBuildOK, evBuildLostPush:
		if w.finish(BuildPod, PodSucceeded) && e == evBuildOK {
			w.push(!w.recipe.Sign)
		}
	case evBuildFail:
		w.finish(BuildPod, PodFailed)
	case evSignOK:
		if w.unsigned {
			if w.finish(SignPod, PodSucceeded) {
				w.push(true)
			}
		} else {
			w.finish(SignPod, PodFailed) // nothing to pull
		}
	case evSignFail:
		w.finish(SignPod, PodFailed)
	case evBumpGeneration:
		g := int64(1)
		if w.gen != nil {
			g = *w.gen + 1
		}
		w.gen = &g
	case evWipeRegistry:
		w.final, w.unsigned = false, false
	case evExternalPush:
		w.push(true)
	case evRegistryFlaps:
		w.down = !w.down
	case evRecipeChanges:
		w.recipe = recipes[(slices.Index(recipes, w.recipe)+1)%len(recipes)]
		w.signFailed = w.signFailed && w.recipe.Sign // a recipe without sign may check and build
	}
	return w.reconcile()
}

// push puts the image (final) or the unsigned image in the registry.
func (w *world) push(final bool) {
	if final {
		w.final, w.everFinal = true, true
	} else {
		w.unsigned = true
	}
}

// finish ends the oldest running pod of kind with phase; false when none runs.
func (w *world) finish(kind PodKind, phase PodPhase) bool {
	for i := range w.pods {
		if w.pods[i].kind == kind && w.pods[i].phase == PodRunning {
			w.pods[i].phase = phase
			return true
		}
	}
	return false
}

// reconcile is the image controller's decision and its side effects.
func (w *world) reconcile() string {
	f := w.facts()
	genBefore := copyGen(w.entry.RebuildTriggerGeneration)
	res := w.m.Step(f)
	fired := res.Fired
	if res.Plan.CheckRegistry {
		ans := RegistryAnswer{Answer: AnswerMissing}
		switch {
		case w.down:
			ans = RegistryAnswer{Answer: AnswerError, Message: "connection refused"}
		case w.final:
			ans.Answer = AnswerPresent
		}
		f.Status, f.Registry = res.Status, &ans
		res = w.m.Step(f)
		fired = append(fired, res.Fired...)
		if ans.Answer != AnswerError {
			w.lastAnswer = ans.Answer
			w.missingSinceBuild = w.missingSinceBuild || ans.Answer == AnswerMissing
		}
	}
	w.entry, w.requeue = res.Status, res.Plan.RequeueAfter
	for _, tr := range fired {
		w.trace = append(w.trace, fmt.Sprintf("  %s: %s -> %s", tr.Trigger, tr.From, tr.To))
		switch Trigger(tr.Trigger) {
		case SignFailed:
			w.signFailed, w.signFailedFor = w.recipe.Sign, genBefore
		case SignSucceeded:
			w.signFailed = false
		}
	}
	if broken := w.carryOut(res.Plan); broken != "" {
		return broken
	}
	return w.check()
}

// carryOut deletes and creates the planned pods, checking the properties a new build breaks.
func (w *world) carryOut(p Plan) string {
	for _, ref := range p.DeletePods {
		w.pods = slices.DeleteFunc(w.pods, func(sp simPod) bool { return sp.kind == ref.Kind && sp.run == ref.Run && sp.phase != PodRunning })
	}
	if p.CreatePod == nil {
		return ""
	}
	w.trace = append(w.trace, fmt.Sprintf("  create %s pod, run %d", p.CreatePod.Kind, p.CreatePod.Run))
	if p.CreatePod.Kind == BuildPod {
		switch {
		case w.lastAnswer == AnswerPresent:
			return "property 2 (nothing is built when the image exists): a build started after the registry answered the image exists"
		case !w.missingSinceBuild:
			return "property 5 (a rebuild only when the image is missing or the trigger changed): a build started with no registry answer 'missing' since the last one"
		case w.signFailed && sameGen(w.gen, w.signFailedFor):
			return "property 4 (a failed sign never rebuilds): a build started after a sign failed, with the same rebuild trigger"
		}
		w.missingSinceBuild = false
	}
	w.pods = append(w.pods, simPod{kind: p.CreatePod.Kind, run: p.CreatePod.Run, phase: PodRunning})
	return ""
}

// check verifies the properties that hold in every state.
func (w *world) check() string {
	running := map[PodKind]int{}
	for _, p := range w.pods {
		if p.phase == PodRunning {
			running[p.kind]++
		}
	}
	if running[BuildPod] > 1 || running[SignPod] > 1 {
		return fmt.Sprintf("property 1 (at most one build and one sign at a time): %d build and %d sign pods running", running[BuildPod], running[SignPod])
	}
	if w.gate(&w.entry) && !w.everFinal {
		return fmt.Sprintf("property 3 (a pair never loads before its image exists): the gate opens in %s and the image was never in the registry", w.entry.State)
	}
	if len(w.entry.Transitions) > kmmv1beta1.MaxImageTransitions || w.entry.Attempts < 0 {
		return fmt.Sprintf("record: %d transitions, attempts %d", len(w.entry.Transitions), w.entry.Attempts)
	}
	return ""
}

// converge lets the world settle cooperatively — the registry answers, every pod succeeds, the
// unsigned image is there to sign (the user pushes it again, or bumps the trigger to rebuild it) —
// and returns what is wrong if the image does not end where it should.
func (w *world) converge() string {
	w.down = false
	if w.recipe.Sign && !w.unsigned {
		if w.recipe.Build {
			if broken := w.apply(evBumpGeneration); broken != "" {
				return broken
			}
		} else {
			w.unsigned = true
		}
	}
	for range 12 {
		for _, e := range []event{evTick, evBuildOK, evSignOK} {
			if broken := w.apply(e); broken != "" {
				return broken
			}
		}
	}
	switch want := w.recipe.Build || w.recipe.Sign || w.final; {
	case want && w.entry.State != Present:
		return fmt.Sprintf("convergence: the image ends in %s, want Present", w.entry.State)
	case want && !w.final && !w.everFinal:
		return "convergence: Present but the image was never pushed"
	case !want && w.entry.State != Missing && w.entry.State != Present:
		return fmt.Sprintf("convergence: an image nothing can make ends in %s, want Missing", w.entry.State)
	}
	if w.gate(&w.entry) != (w.entry.State == Present) {
		return "convergence: the gate disagrees with the state"
	}
	return ""
}

// key is the world's canonical form for the explorer: everything that decides what happens next,
// with times relative to now and without the transition log.
func (w *world) key() string {
	since := func(t *metav1.Time) time.Duration {
		if t == nil {
			return -1
		}
		return w.now.Sub(t.Time)
	}
	e := &w.entry
	return fmt.Sprintf("%+v|%v%v%v|%v|%v|%s %s %d %d %v %v %v|%v %v %v %v %v", w.recipe, w.final, w.unsigned, w.down, w.pods, gen(w.gen),
		e.State, e.Reason, e.Attempts, e.Run, gen(e.RebuildTriggerGeneration), since(e.LastTransitionTime), since(e.LastCheckTime),
		w.everFinal, w.lastAnswer, w.missingSinceBuild, w.signFailed, gen(w.signFailedFor))
}

func gen(g *int64) string {
	if g == nil {
		return "-"
	}
	return fmt.Sprint(*g)
}

func (w *world) String() string {
	return fmt.Sprintf("recipe %+v:\n  %s", w.recipe, strings.Join(w.trace, "\n  "))
}

// recipes are the four recipes a spec entry can have.
var recipes = []Recipe{{}, {Build: true}, {Sign: true}, {Build: true, Sign: true}}
