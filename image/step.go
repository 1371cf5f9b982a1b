package image

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// The timing of the machine.
const (
	// BackOffBase is the first back-off after a failure; it doubles with each further one.
	BackOffBase = 10 * time.Second
	// BackOffMax caps the back-off.
	BackOffMax = 5 * time.Minute
	// MissingPoll is how often an image nothing can make is looked for again.
	MissingPoll = time.Minute
	// maxTriggersPerStep bounds the transitions one decision may chain (facts do not change within
	// a step, so a longer chain would be a cycle).
	maxTriggersPerStep = 4
	// maxMessage bounds the status message (the API's bound).
	maxMessage = 4096
)

// Reasons that are not triggers.
const (
	// ReasonRegistryUnreachable: the registry gave no answer; the check is retried with back-off.
	ReasonRegistryUnreachable = "RegistryUnreachable"
)

// Result is the decision for one image.
type Result struct {
	// Status is the new status entry.
	Status kmmv1beta1.ModuleImageState
	// Fired are the transitions this step made, oldest first.
	Fired []kmmv1beta1.ImageTransition
	// Plan is what the controller must make true while the image is in its (new) state.
	Plan Plan
}

// Plan is the side effects the controller carries out, each idempotent.
type Plan struct {
	// CheckRegistry asks the controller to ask the registry about the image and call Step again
	// with the answer in Facts.Registry.
	CheckRegistry bool
	// CreatePod, when set, is the build or sign pod to create.
	CreatePod *PodIntent
	// DeletePods are finished pods to delete: succeeded ones at once, a failed one only when the
	// next pod of its kind is due (its log stays readable until then).
	DeletePods []PodRef
	// RequeueAfter asks for another decision after this long (0: only on events).
	RequeueAfter time.Duration
	// Waiting says why nothing moves ("" when something does).
	Waiting string
}

// PodIntent is a pod to create.
type PodIntent struct {
	Kind PodKind
	Run  int32
}

// PodRef names a pod by kind and run.
type PodRef struct {
	Kind PodKind
	Run  int32
}

// Step decides for one image with the default machine.
func Step(f Facts) Result { return Default().Step(f) }

// Step decides for one image: it fires the triggers the facts amount to, records each transition
// in the status entry, and plans the side effects of the resulting state.
func (m *Machine) Step(f Facts) Result {
	st := *f.Status.DeepCopy()
	st.Image = f.Image
	if st.State == "" {
		// A new image, or an entry upstream wrote: check the registry first, whatever it said.
		st = kmmv1beta1.ModuleImageState{Image: f.Image, State: Checking, LastTransitionTime: timeP(f.Now),
			RebuildTriggerGeneration: copyGen(f.Generation), Transitions: st.Transitions}
	}
	if st.State == Checking {
		// The check about to be made (or being recorded) is for the generation of now.
		st.RebuildTriggerGeneration = copyGen(f.Generation)
	}
	noteRegistry(&st, &f)
	var res Result
	for range maxTriggersPerStep {
		f.Status = st
		t, ok := m.derive(&f)
		if !ok {
			break
		}
		to, err := m.fire(st.State, t, &f)
		if err != nil {
			break // derive offers only permitted triggers; unreachable
		}
		res.Fired = append(res.Fired, record(&st, t, to, &f))
	}
	st.Status = UpstreamStatus(st.State)
	f.Status = st
	res.Status = st
	res.Plan = plan(&f)
	return res
}

// derive returns the first trigger, in AllTriggers' order, that the facts amount to and the
// machine permits in the current state.
func (m *Machine) derive(f *Facts) (Trigger, bool) {
	for _, t := range AllTriggers {
		if observed(t, f) && m.canFire(f.Status.State, t, f) {
			return t, true
		}
	}
	return "", false
}

// observed says whether the facts amount to t (whatever the state).
func observed(t Trigger, f *Facts) bool {
	st := &f.Status
	switch t {
	case BuildSucceeded, BuildFailed:
		p := currentPod(f.BuildPods, st.Run)
		return p != nil && p.Phase == map[Trigger]PodPhase{BuildSucceeded: PodSucceeded, BuildFailed: PodFailed}[t]
	case SignSucceeded, SignFailed:
		p := currentPod(f.SignPods, st.Run)
		return p != nil && p.Phase == map[Trigger]PodPhase{SignSucceeded: PodSucceeded, SignFailed: PodFailed}[t]
	case RebuildRequested:
		return !sameGen(f.Generation, st.RebuildTriggerGeneration)
	case ImageFound:
		return f.Registry != nil && f.Registry.Answer == AnswerPresent
	case ImageNotFound:
		return f.Registry != nil && f.Registry.Answer == AnswerMissing
	case BackOffExpired:
		return !f.Now.Before(backOffEnd(st))
	}
	return false
}

// noteRegistry records a registry check in the entry: its time, and for an error the failure.
func noteRegistry(st *kmmv1beta1.ModuleImageState, f *Facts) {
	if f.Registry == nil {
		return
	}
	st.LastCheckTime = timeP(f.Now)
	if f.Registry.Answer == AnswerError {
		st.Attempts++
		st.Reason = ReasonRegistryUnreachable
		st.Message = clip("the registry check failed: " + f.Registry.Message)
	}
}

// record applies a transition to the entry and returns its log line.
func record(st *kmmv1beta1.ModuleImageState, t Trigger, to State, f *Facts) kmmv1beta1.ImageTransition {
	from := st.State
	switch {
	case IsFailure(t):
		st.Attempts++
	case t == ImageFound || t == BuildSucceeded || t == SignSucceeded || t == RebuildRequested:
		st.Attempts = 0
	}
	if to == Building || to == Signing {
		st.Run++ // a new pod run; only its pod's outcome counts
	}
	if to == Checking {
		st.RebuildTriggerGeneration = copyGen(f.Generation)
		st.LastCheckTime = nil // a new check is due at once
	}
	tr := kmmv1beta1.ImageTransition{Trigger: string(t), From: from, To: to, Time: metav1.NewTime(f.Now), Reason: string(t)}
	st.Transitions = append(st.Transitions, tr)
	if n := len(st.Transitions); n > kmmv1beta1.MaxImageTransitions {
		st.Transitions = st.Transitions[n-kmmv1beta1.MaxImageTransitions:]
	}
	st.State, st.LastTransitionTime, st.Reason = to, timeP(f.Now), string(t)
	st.Message = clip(messageFor(t, f))
	return tr
}

// messageFor explains a transition; a failure quotes its pod.
func messageFor(t Trigger, f *Facts) string {
	switch t {
	case BuildFailed:
		return "the build failed: " + currentPod(f.BuildPods, f.Status.Run).Message
	case SignFailed:
		return "the sign failed: " + currentPod(f.SignPods, f.Status.Run).Message
	case ImageFound:
		return "the image is in its registry"
	case ImageNotFound:
		return "the image is not in its registry"
	case RebuildRequested:
		return "imageRebuildTriggerGeneration changed: the image is checked again"
	}
	return ""
}

// plan says what to do in the entry's state.
func plan(f *Facts) Plan {
	st := &f.Status
	var p Plan
	p.DeletePods = succeededPods(f)
	switch st.State {
	case Checking:
		p.CheckRegistry, p.RequeueAfter = checkDue(st, f.Now, backOff(st.Attempts))
	case Missing:
		p.CheckRegistry, p.RequeueAfter = checkDue(st, f.Now, MissingPoll)
		p.Waiting = "the image is not in its registry and nothing can build or sign it"
	case Building:
		planPod(&p, BuildPod, f.BuildPods, st.Run)
	case Signing:
		planPod(&p, SignPod, f.SignPods, st.Run)
	case BuildBackOff, SignBackOff:
		p.RequeueAfter = backOffEnd(st).Sub(f.Now)
		p.Waiting = fmt.Sprintf("attempt %d failed: retried after a back-off", st.Attempts)
	}
	return p
}

// checkDue says whether a registry check is due, or after how long it will be.
func checkDue(st *kmmv1beta1.ModuleImageState, now time.Time, every time.Duration) (bool, time.Duration) {
	if st.LastCheckTime == nil {
		return true, 0
	}
	if wait := st.LastCheckTime.Add(every).Sub(now); wait > 0 {
		return false, wait
	}
	return true, 0
}

// planPod plans the pod of the current run: the deletion of a failed older one (kept until now so
// that its log could be read) and the creation of the current one if it does not exist. No pod of
// an older run is running: the machine leaves Building and Signing only on their pod's outcome.
func planPod(p *Plan, kind PodKind, pods []Pod, run int32) {
	for _, pod := range pods {
		if pod.Phase == PodFailed && pod.Run != run {
			p.DeletePods = append(p.DeletePods, PodRef{Kind: kind, Run: pod.Run})
		}
	}
	if currentPod(pods, run) == nil {
		p.CreatePod = &PodIntent{Kind: kind, Run: run}
	}
}

// succeededPods are the finished successful pods: their outcome is recorded (or stale).
func succeededPods(f *Facts) []PodRef {
	var out []PodRef
	for kind, pods := range map[PodKind][]Pod{BuildPod: f.BuildPods, SignPod: f.SignPods} {
		for _, pod := range pods {
			if pod.Phase == PodSucceeded && (pod.Run != f.Status.Run || !inFlight(f.Status.State, kind)) {
				out = append(out, PodRef{Kind: kind, Run: pod.Run})
			}
		}
	}
	slices.SortFunc(out, func(a, b PodRef) int {
		if a.Kind != b.Kind {
			return map[bool]int{true: -1, false: 1}[a.Kind < b.Kind]
		}
		return int(a.Run - b.Run)
	})
	return out
}

// inFlight says whether a pod of kind is what state waits for.
func inFlight(s State, kind PodKind) bool {
	return (s == Building && kind == BuildPod) || (s == Signing && kind == SignPod)
}

func currentPod(pods []Pod, run int32) *Pod {
	for i := range pods {
		if pods[i].Run == run {
			return &pods[i]
		}
	}
	return nil
}

// backOff is the wait after the attempts-th consecutive failure: 10 s doubling, capped at 5 min.
func backOff(attempts int32) time.Duration {
	if attempts <= 0 {
		return 0
	}
	d := BackOffBase
	for i := int32(1); i < attempts && d < BackOffMax; i++ {
		d *= 2
	}
	return min(d, BackOffMax)
}

// backOffEnd is when the back-off of a back-off state is over.
func backOffEnd(st *kmmv1beta1.ModuleImageState) time.Time {
	if st.LastTransitionTime == nil {
		return time.Time{}
	}
	return st.LastTransitionTime.Add(backOff(st.Attempts))
}

// UpstreamStatus is upstream's summary of a state (status.imagesStates[].status): what upstream's
// operator would read after a switch back.
func UpstreamStatus(s State) kmmv1beta1.ImageState {
	switch s {
	case Present:
		return kmmv1beta1.ImageExists
	case Missing:
		return kmmv1beta1.ImageDoesNotExist
	case Building, BuildBackOff:
		return kmmv1beta1.ImageNeedsBuilding
	case Signing, SignBackOff:
		return kmmv1beta1.ImageNeedsSigning
	}
	return ""
}

// MayLoad is the pair gate: whether a pair may load the image of this status entry. Only an image
// the registry showed after its last build, sign or rebuild trigger (Present) may be loaded; nil
// (no entry yet) may not.
func MayLoad(st *kmmv1beta1.ModuleImageState) bool {
	return st != nil && st.State == Present
}

func sameGen(a, b *int64) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func copyGen(g *int64) *int64 {
	if g == nil {
		return nil
	}
	v := *g
	return &v
}

func timeP(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}

func clip(s string) string {
	if len(s) > maxMessage {
		return s[len(s)-maxMessage:]
	}
	return s
}
