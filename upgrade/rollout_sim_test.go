package upgrade

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"pgregory.net/rapid"

	"github.com/kmm-project/kmm/test/rapidtb"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// This file simulates the automatic rollout: a small world of nodes whose (node, Module) pairs
// move one state at a time along seed 002's upgrade path (Loaded v1 → DevicePluginDraining → the
// device plugin pod leaves → Unloading → Upgrading → Loading → Loaded v2 → the device plugin pod
// comes back), nodes that go NotReady or get cordoned at random, and the real PlanRollout moving
// the version-module labels. Invariants are checked after every step; when events stop and every
// node is Ready, every node that is not skipped must end Loaded with the new version. The
// package's TestMain (suite_test.go) lengthens rapid's interleavings for it.

// pausedRuns counts planner runs that found the rollout paused at its failure budget, so that the
// property test can show it exercises the budget.
var pausedRuns int

// startedBesideUnavailable counts planner runs that started nodes while another node was NotReady
// or cordoned, so that the property test can show it exercises that budget rule.
var startedBesideUnavailable int

// rollbackIntents counts the nodes planners sent back to the old version (failed nodes and undos),
// canaryWaits the planner runs that found the canaries soaking: the property test shows it
// exercises both.
var rollbackIntents, canaryWaits int

const (
	simOld    = "v1"
	simNew    = "v2"
	simKernel = "6.1.0-1-amd64"
)

// rolloutFaults are deliberately broken planners (wrappers that hide facts from PlanRollout) and
// a broken node; the seeded-fault tests require the simulation to catch each one.
type rolloutFaults struct {
	ignoresBudget         bool // the planner plans as if maxUnavailable were 100%
	ignoresUnavailable    bool // the planner sees every node Ready and schedulable
	ignoresSkip           bool // the planner does not see the upgrade-skip label
	unloadsBeforeDPLeaves bool // the node unloads while the device plugin pod still runs
	ignoresFailureBudget  bool // the planner plans as if maxFailed were unset
	failedNotCounted      bool // the planner sees a failed node as done
	skipsValidation       bool // the planner sees every validation pod succeeded
	ignoresDevicePlugin   bool // the planner never sees a device plugin pod pending
	ignoresSoak           bool // the planner plans as if canary.soakSeconds were 0
	forgetsRollback       bool // the planner does not see status.rollout.rollback
	rollbackLoadsFirst    bool // a node sent back loads the old version over the new one, without unloading it
}

type rolloutSimNode struct {
	name     string
	label    string // user version-module label, "" when absent
	skip     bool
	ready    bool
	cordoned bool
	state    kmmv1beta1.ModuleState
	loaded   string // version loaded in the node's kernel
	dpPod    bool   // a device plugin pod runs on the node
	bad      bool   // its load of the new version fails until fixed
	// validates says the Module has a validation pod; validation is the node's pod for the new
	// version; badValidation makes it fail until fixed.
	validates     bool
	validation    ValidationPhase
	badValidation bool
	initial       rolloutSimNode0
	// lastLoaded is the version loaded at the last check: a node must unload one version before
	// it loads another.
	lastLoaded string
}

// rolloutSimNode0 is what a node started with, to check that skipped nodes are left alone.
type rolloutSimNode0 struct {
	label, loaded string
	state         kmmv1beta1.ModuleState
}

type rolloutWorld struct {
	module    *kmmv1beta1.Module
	nodes     []*rolloutSimNode
	budget    int // maxUnavailable resolved by the test itself, not by the code under test
	faults    rolloutFaults
	maxFailed int // maxFailed resolved by the test itself (0: no budget)
	// status is the rollout's status as the controller last wrote it; resumes is the user's
	// rollout-resume annotation (a counter).
	status  *kmmv1beta1.RolloutStatus
	resumes int
	// The test's own model of the pause: paused at the budget, the nodes failed at the last
	// resume, and a resume the planner has not seen yet.
	modelPaused   bool
	modelAtResume int
	resumePending bool
	// now is the planner's clock: a minute per planner run. canaries (the first canaryCount
	// managed nodes by name) and soak are the test's own model of upgradePolicy.canary, soakSince
	// when the canaries were last all done since, canaryPassed once they soaked.
	now          time.Time
	canaries     []string
	soak         time.Duration
	soakSince    *time.Time
	canaryPassed bool
	// The test's model of the rollbacks: upgradePolicy.rollbackFailed, whether some plan saw a
	// node run v1 (the previous version is known), undos (the rollout-undo annotation, a counter),
	// an undo the planner has not seen yet and one in force.
	rollbackFailed bool
	previousKnown  bool
	undos          int
	undoPending    bool
	undoActive     bool
	trace          []string
	violations     []string
}

// rolloutSetup is the random part of a world: the node count, each node's start and the policy.
type rolloutSetup struct {
	n              int
	unlabelled     []bool // the node starts without the label and without the module (adoption)
	skip           []bool
	notReady       []bool
	bad            []bool
	badValidation  []bool
	validates      bool
	maxUnavailable intstr.IntOrString
	maxFailed      *intstr.IntOrString
	// canaryCount > 0 gives the Module a canary of that many nodes soaking soakMinutes.
	canaryCount, soakMinutes int
	rollbackFailed           bool
}

func newRolloutWorld(s rolloutSetup, f rolloutFaults) *rolloutWorld {
	m := rolloutModule(simNew, auto(&s.maxUnavailable))
	m.Spec.UpgradePolicy.MaxFailed = s.maxFailed
	if s.validates {
		m.Spec.UpgradePolicy.Validation = &kmmv1beta1.ValidationSpec{Container: kmmv1beta1.ValidationContainerSpec{Image: "check"}}
	}
	if s.canaryCount > 0 {
		m.Spec.UpgradePolicy.Canary = &kmmv1beta1.CanarySpec{Count: int32(s.canaryCount), SoakSeconds: int32(60 * s.soakMinutes)}
	}
	m.Spec.UpgradePolicy.RollbackFailed = s.rollbackFailed
	w := &rolloutWorld{module: m, faults: f, now: tNow, soak: time.Duration(s.soakMinutes) * time.Minute, rollbackFailed: s.rollbackFailed}
	managed := 0
	for i := range s.n {
		n := &rolloutSimNode{name: fmt.Sprintf("n%d", i), label: simOld, skip: s.skip[i], ready: !s.notReady[i],
			state: kmmv1beta1.StateLoaded, loaded: simOld, dpPod: true, bad: s.bad[i], validates: s.validates}
		if s.badValidation != nil {
			n.badValidation = s.badValidation[i]
		}
		if s.unlabelled[i] {
			n.label, n.state, n.loaded, n.dpPod = "", kmmv1beta1.StateAbsent, "", false
		}
		n.initial = rolloutSimNode0{label: n.label, loaded: n.loaded, state: n.state}
		n.lastLoaded = n.loaded
		w.nodes = append(w.nodes, n)
		if !n.skip {
			managed++
			if len(w.canaries) < s.canaryCount {
				w.canaries = append(w.canaries, n.name)
			}
		}
	}
	w.budget = expectedBudget(s.maxUnavailable, managed)
	if s.maxFailed != nil {
		w.maxFailed = expectedBudget(*s.maxFailed, managed)
	}
	w.log("start: %s, maxUnavailable %s = %d of %d managed nodes, maxFailed %d, canaries %v soaking %v, rollbackFailed %v",
		w.describe(), s.maxUnavailable.String(), w.budget, managed, w.maxFailed, w.canaries, w.soak, w.rollbackFailed)
	return w
}

// expectedBudget resolves maxUnavailable the way the policy documents it (independently of budget()).
func expectedBudget(mu intstr.IntOrString, managed int) int {
	if mu.Type == intstr.Int {
		return mu.IntValue()
	}
	var p int
	if _, err := fmt.Sscanf(mu.StrVal, "%d%%", &p); err != nil {
		panic(err)
	}
	if p > 0 {
		return max(1, p*managed/100)
	}
	return 0
}

func (w *rolloutWorld) log(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

func (w *rolloutWorld) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf(format, args...)+"\n  trace: "+strings.Join(w.trace, "\n    "))
}

func (w *rolloutWorld) describe() string {
	parts := make([]string, 0, len(w.nodes))
	for _, n := range w.nodes {
		s := fmt.Sprintf("%s[label=%q %s %q", n.name, n.label, n.state, n.loaded)
		if n.dpPod {
			s += " dp"
		}
		if !n.ready {
			s += " NotReady"
		}
		if n.cordoned {
			s += " cordoned"
		}
		if n.skip {
			s += " skip"
		}
		if n.bad {
			s += " bad"
		}
		if n.validation != ValidationNone || n.badValidation {
			s += fmt.Sprintf(" validation=%s", n.validation)
			if n.badValidation {
				s += "(bad)"
			}
		}
		parts = append(parts, s+"]")
	}
	return strings.Join(parts, " ")
}

// input is what the rollout controller would gather, with the fault's blind spots applied.
func (w *rolloutWorld) input() RolloutInput {
	m := w.module
	if w.faults.ignoresBudget {
		m = m.DeepCopy()
		all := intstr.FromString("100%")
		m.Spec.UpgradePolicy.MaxUnavailable = &all
	}
	if w.faults.ignoresFailureBudget {
		m = m.DeepCopy()
		m.Spec.UpgradePolicy.MaxFailed = nil
	}
	m = m.DeepCopy()
	if w.faults.ignoresSoak && m.Spec.UpgradePolicy.Canary != nil {
		m.Spec.UpgradePolicy.Canary.SoakSeconds = 0
	}
	m.Status.Rollout = w.status.DeepCopy()
	if w.faults.forgetsRollback && m.Status.Rollout != nil {
		m.Status.Rollout.Rollback = nil
	}
	m.Annotations = map[string]string{}
	if w.resumes > 0 {
		m.Annotations[kmmv1beta1.RolloutResumeAnnotation] = fmt.Sprint(w.resumes)
	}
	if w.undos > 0 {
		m.Annotations[kmmv1beta1.RolloutUndoAnnotation] = fmt.Sprint(w.undos)
	}
	in := RolloutInput{Module: m, Now: w.now}
	for _, n := range w.nodes {
		rn := RolloutNode{Name: n.name, Labels: map[string]string{}, Ready: n.ready, Unschedulable: n.cordoned, LoadedVersion: n.loaded,
			KernelVersion: simKernel}
		if n.state != kmmv1beta1.StateAbsent {
			rn.State = n.state
		}
		if n.loaded != "" {
			rn.Running = &kmmv1beta1.PreviousConfig{Config: kmmv1beta1.ModuleConfig{KernelVersion: simKernel, ContainerImage: "reg/nic:" + n.loaded, Version: n.loaded}}
		}
		rn.Validation = ValidationPod{Phase: n.validation}
		rn.DevicePluginPending = n.state == kmmv1beta1.StateLoaded && !n.dpPod && !w.faults.ignoresDevicePlugin
		if w.faults.skipsValidation {
			rn.Validation.Phase = ValidationSucceeded
		}
		if n.state == kmmv1beta1.StateLoadBackOff {
			rn.Reason = "ImagePull"
			if w.faults.failedNotCounted {
				rn.State, rn.LoadedVersion = kmmv1beta1.StateLoaded, n.label
			}
		}
		if n.label != "" {
			rn.Labels[tLabel] = n.label
		}
		if n.skip && !w.faults.ignoresSkip {
			rn.Labels[tSkip] = "true"
		}
		if w.faults.ignoresUnavailable {
			rn.Ready, rn.Unschedulable = true, false
		}
		in.Nodes = append(in.Nodes, rn)
	}
	return in
}

func (w *rolloutWorld) node(name string) *rolloutSimNode {
	for _, n := range w.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

func (n *rolloutSimNode) done() bool {
	return n.label == simNew && n.state == kmmv1beta1.StateLoaded && n.loaded == simNew && n.dpPod &&
		(!n.validates || n.validation == ValidationSucceeded)
}

func (n *rolloutSimNode) inProgress() bool {
	return n.label == simNew && !n.done()
}

// rollingBack is a node whose label went back to the old version and that is on its way out of
// the new one (a node loading the old version from nothing is like a node being adopted: pending).
func (n *rolloutSimNode) rollingBack() bool {
	switch n.state {
	case kmmv1beta1.StateDevicePluginDraining, kmmv1beta1.StateUnloading, kmmv1beta1.StateUpgrading, kmmv1beta1.StateUnloadBackOff:
		return n.label == simOld
	}
	return n.label == simOld && n.loaded == simNew
}

// failed is the test's own UpgradeFailed: a managed node whose load of the new version backs off.
func (n *rolloutSimNode) failed() bool {
	return !n.skip && n.label == simNew && (n.state == kmmv1beta1.StateLoadBackOff ||
		(n.state == kmmv1beta1.StateLoaded && n.loaded == simNew && n.validation == ValidationFailed))
}

// modelPause updates the test's model of the pause from what the planner is about to see.
func (w *rolloutWorld) modelPause() {
	failed := 0
	for _, n := range w.nodes {
		if n.failed() && !w.undoActive { // an undo sends every failed node back at once
			failed++
		}
	}
	w.modelAtResume = min(w.modelAtResume, failed)
	if w.resumePending {
		w.modelPaused, w.modelAtResume, w.resumePending = false, failed, false
	}
	if w.maxFailed > 0 && failed-w.modelAtResume >= w.maxFailed {
		if !w.modelPaused {
			w.log("model: %d failed, %d of them at the last resume, maxFailed %d: paused", failed, w.modelAtResume, w.maxFailed)
		}
		w.modelPaused = true
	}
}

// plan runs the planner and applies its intents (the rollout controller's patches).
func (w *rolloutWorld) plan() {
	w.now = w.now.Add(time.Minute)
	w.modelRollback(w.resumePending)
	w.modelPause()
	w.modelCanary()
	d := DecideRollout(w.input())
	w.status = d.Status
	intents := d.Intents
	started := w.starting(intents)
	if w.modelPaused {
		pausedRuns++
		// A node already on its way (in progress, or going back) may be moved to the new version
		// while paused (docs/api.md: it is unavailable already); none may start towards it.
		if forward := towards(started, simNew); len(forward) > 0 {
			w.violate("invariant budget: the rollout started %v while %d nodes beyond those failed at the last resume are UpgradeFailed, maxFailed %d: %s",
				forward, w.countFailed()-w.modelAtResume, w.maxFailed, w.describe())
		}
	}
	w.checkIntents(intents)
	if paused := d.Status != nil && d.Status.Paused != nil; paused != w.modelPaused {
		w.violate("invariant pause status: status.rollout.paused is %v, the model says %v: %s", paused, w.modelPaused, w.describe())
	}
	for _, name := range d.Validate {
		n := w.node(name)
		if n.state != kmmv1beta1.StateLoaded || n.loaded != simNew || n.validation != ValidationNone || !n.validates || !n.dpPod {
			w.violate("invariant validation: a validation pod for %s, which is not Loaded %s without one: %s", name, simNew, w.describe())
		}
		n.validation = ValidationRunning
		w.log("%s: validation pod created", name)
	}
	if len(intents) == 0 {
		return
	}
	w.log("plan: %v", intents)
	for _, n := range w.nodes {
		if !n.skip && !n.done() && !n.inProgress() && (!n.ready || n.cordoned) {
			startedBesideUnavailable++
			break
		}
	}
	for _, it := range intents {
		n := w.node(it.Node)
		switch {
		case n.skip:
			w.violate("invariant skip: the rollout moved the label of skipped node %s", n.name)
		case (!n.ready || n.cordoned) && !n.inProgress() && !n.rollingBack():
			w.violate("invariant unavailable: the rollout started %s while it is NotReady or cordoned", n.name)
		case n.label == it.Version:
			w.violate("invariant idempotence: the rollout re-set the label of %s", n.name)
		}
		n.label = it.Version
	}
	w.checkRolledBack()
	// Right after the rollout started nodes, nodes out of service for any reason must fit the budget.
	unavailable := 0
	for _, n := range w.nodes {
		if !n.skip && !n.done() && (n.inProgress() || n.rollingBack() || !n.ready || n.cordoned) {
			unavailable++
		}
	}
	if unavailable > w.budget && len(started) > 0 {
		w.violate("invariant maxUnavailable: after starting %v, %d nodes are unavailable (in progress, NotReady or cordoned), maxUnavailable is %d: %s",
			started, unavailable, w.budget, w.describe())
	}
}

// starting keeps the intents that start a node (not those that move one already on its way).
func (w *rolloutWorld) starting(intents []Intent) []Intent {
	var started []Intent
	for _, it := range intents {
		if n := w.node(it.Node); !n.inProgress() && !n.rollingBack() {
			started = append(started, it)
		}
	}
	return started
}

func (w *rolloutWorld) countFailed() int {
	failed := 0
	for _, n := range w.nodes {
		if n.failed() {
			failed++
		}
	}
	return failed
}

// resume is the user's kubectl kmm rollout resume.
func (w *rolloutWorld) resume() {
	w.resumes++
	w.resumePending = true
	w.log("user: resume %d", w.resumes)
}

// fix makes a bad node's load and validation succeed from now on; the user deletes its failed
// validation pod, which the rollout creates again.
func (w *rolloutWorld) fix(i int) {
	n := w.nodes[i]
	if n.bad || n.badValidation || n.validation == ValidationFailed {
		n.bad, n.badValidation = false, false
		if n.validation == ValidationFailed {
			n.validation = ValidationNone
		}
		w.log("%s: fixed", n.name)
	}
}

// advance moves a node one step along seed 002's path (the NMC controller, the version label
// controller and the device plugin DaemonSet together). A NotReady or cordoned node makes no
// progress: no worker pod is created there.
func (w *rolloutWorld) advance(i int) {
	n := w.nodes[i]
	if !n.ready || n.cordoned {
		return
	}
	before := fmt.Sprintf("%s %q dp=%v", n.state, n.loaded, n.dpPod)
	switch n.state {
	case kmmv1beta1.StateAbsent:
		if n.label != "" {
			n.state = kmmv1beta1.StateLoading
		}
	case kmmv1beta1.StateLoaded:
		switch {
		case n.label == simOld && n.loaded == simNew && w.faults.rollbackLoadsFirst:
			n.loaded = simOld
		case n.label != n.loaded && n.label != "":
			n.state = kmmv1beta1.StateDevicePluginDraining
		case !n.dpPod:
			n.dpPod = true
		case n.validation == ValidationRunning && n.badValidation:
			n.validation = ValidationFailed
		case n.validation == ValidationRunning:
			n.validation = ValidationSucceeded
		}
	case kmmv1beta1.StateDevicePluginDraining:
		if n.dpPod && !w.faults.unloadsBeforeDPLeaves {
			n.dpPod = false
		} else {
			n.state = kmmv1beta1.StateUnloading
		}
	case kmmv1beta1.StateUnloading:
		n.state, n.loaded = kmmv1beta1.StateUpgrading, ""
	case kmmv1beta1.StateUpgrading:
		n.state = kmmv1beta1.StateLoading
	case kmmv1beta1.StateLoading:
		if n.bad && n.label == simNew {
			n.state = kmmv1beta1.StateLoadBackOff
		} else {
			n.state, n.loaded = kmmv1beta1.StateLoaded, n.label
		}
	case kmmv1beta1.StateLoadBackOff:
		n.state = kmmv1beta1.StateLoading
	}
	if after := fmt.Sprintf("%s %q dp=%v", n.state, n.loaded, n.dpPod); after != before {
		w.log("%s: %s → %s", n.name, before, after)
	}
}

func (w *rolloutWorld) flipReady(i int) {
	n := w.nodes[i]
	n.ready = !n.ready
	w.log("%s: Ready=%v", n.name, n.ready)
}

func (w *rolloutWorld) flipCordon(i int) {
	n := w.nodes[i]
	n.cordoned = !n.cordoned
	w.log("%s: cordoned=%v", n.name, n.cordoned)
}

// check verifies the invariants that hold after every step.
func (w *rolloutWorld) check() {
	inProgress, outOfLoaded := 0, 0
	for _, n := range w.nodes {
		if n.skip {
			continue
		}
		if n.inProgress() || n.rollingBack() {
			inProgress++
		}
		if n.loaded != "" && n.lastLoaded != "" && n.loaded != n.lastLoaded {
			w.violate("invariant unload first: %s loaded %s over %s without unloading it: %s", n.name, n.loaded, n.lastLoaded, w.describe())
		}
		n.lastLoaded = n.loaded
		if n.label == simNew && n.state != kmmv1beta1.StateLoaded {
			outOfLoaded++
		}
		unloading := n.state == kmmv1beta1.StateUnloading || n.state == kmmv1beta1.StateUpgrading || n.state == kmmv1beta1.StateLoading ||
			n.state == kmmv1beta1.StateLoadBackOff
		if unloading && n.dpPod {
			w.violate("invariant device plugin: %s unloads (%s) while its device plugin pod runs", n.name, n.state)
		}
	}
	if inProgress > w.budget || outOfLoaded > w.budget {
		w.violate("invariant maxUnavailable: %d nodes upgrading, %d out of Loaded, maxUnavailable is %d: %s",
			inProgress, outOfLoaded, w.budget, w.describe())
	}
}

// settle stops the events (every node Ready and schedulable) and runs the controllers until
// nothing moves, then checks that the rollout converged.
func (w *rolloutWorld) settle() {
	// First the controllers alone, bad nodes still bad: failures pile up to the budget.
	w.rounds()
	for i := range w.nodes {
		w.fix(i)
	}
	w.resume()
	for i, n := range w.nodes {
		if !n.ready {
			w.flipReady(i)
		}
		if n.cordoned {
			w.flipCordon(i)
		}
	}
	w.check()
	w.rounds()
	for _, n := range w.nodes {
		switch {
		case n.skip && (n.label != n.initial.label || n.loaded != n.initial.loaded || n.state != n.initial.state):
			w.violate("invariant skip: skipped node %s changed: %s", n.name, w.describe())
		case !n.skip && (!n.done() || !n.dpPod):
			w.violate("invariant convergence: %s did not end Loaded %s with its device plugin: %s", n.name, simNew, w.describe())
		}
	}
}

// rounds runs the planner and every node's step in rounds, long enough for every node to upgrade.
func (w *rolloutWorld) rounds() {
	for range 8*len(w.nodes) + 4 + int(w.soak/time.Minute) {
		w.plan()
		w.check()
		for i := range w.nodes {
			w.advance(i)
			w.check()
		}
	}
}

// rolloutSetupGen draws a world's setup.
func rolloutSetupGen(t *rapid.T) rolloutSetup {
	n := rapid.IntRange(2, 8).Draw(t, "nodes")
	s := rolloutSetup{
		n:          n,
		unlabelled: rapid.SliceOfN(rapid.Map(rapid.Float64Range(0, 1), func(f float64) bool { return f < 0.2 }), n, n).Draw(t, "unlabelled"),
		skip:       rapid.SliceOfN(rapid.Map(rapid.Float64Range(0, 1), func(f float64) bool { return f < 0.15 }), n, n).Draw(t, "skip"),
		notReady:   rapid.SliceOfN(rapid.Map(rapid.Float64Range(0, 1), func(f float64) bool { return f < 0.15 }), n, n).Draw(t, "notReady"),
		bad:        rapid.SliceOfN(rapid.Map(rapid.Float64Range(0, 1), func(f float64) bool { return f < 0.35 }), n, n).Draw(t, "bad"),
	}
	s.validates = rapid.Bool().Draw(t, "validates")
	s.badValidation = rapid.SliceOfN(rapid.Map(rapid.Float64Range(0, 1), func(f float64) bool { return f < 0.2 }), n, n).Draw(t, "badValidation")
	if rapid.IntRange(0, 2).Draw(t, "budgeted") > 0 {
		// Small budgets, so that the bad nodes reach them.
		mf := intstr.FromInt32(int32(rapid.IntRange(1, min(n, 2)).Draw(t, "maxFailed")))
		s.maxFailed = &mf
	}
	if rapid.IntRange(0, 2).Draw(t, "canary") > 0 {
		s.canaryCount = rapid.IntRange(1, 2).Draw(t, "canaryCount")
		s.soakMinutes = rapid.IntRange(0, 5).Draw(t, "soakMinutes")
	}
	s.rollbackFailed = rapid.Bool().Draw(t, "rollbackFailed")
	if rapid.Bool().Draw(t, "percent") {
		s.maxUnavailable = intstr.FromString(fmt.Sprintf("%d%%", rapid.SampledFrom([]int{10, 25, 34, 50, 75, 100}).Draw(t, "pct")))
	} else {
		s.maxUnavailable = intstr.FromInt32(int32(rapid.IntRange(1, n).Draw(t, "maxUnavailable")))
	}
	return s
}

// rolloutMachine adapts the world to rapid's state-machine actions.
type rolloutMachine struct{ w *rolloutWorld }

// Plan runs the rollout controller once.
func (m *rolloutMachine) Plan(*rapid.T) { m.w.plan() }

// Advance moves one node's pair one step.
func (m *rolloutMachine) Advance(t *rapid.T) {
	m.w.advance(rapid.IntRange(0, len(m.w.nodes)-1).Draw(t, "node"))
}

// FlipReady makes a node NotReady or Ready again.
func (m *rolloutMachine) FlipReady(t *rapid.T) {
	m.w.flipReady(rapid.IntRange(0, len(m.w.nodes)-1).Draw(t, "node"))
}

// FlipCordon cordons or uncordons a node.
func (m *rolloutMachine) FlipCordon(t *rapid.T) {
	m.w.flipCordon(rapid.IntRange(0, len(m.w.nodes)-1).Draw(t, "node"))
}

// User is the user, now and then: fixing a bad node's load (1 in 10) or resuming the rollout (1
// in 10); rarer than the controllers' steps, so that failures pile up to the budget.
func (m *rolloutMachine) User(t *rapid.T) {
	switch rapid.IntRange(0, 19).Draw(t, "user") {
	case 0, 1:
		m.w.fix(rapid.IntRange(0, len(m.w.nodes)-1).Draw(t, "node"))
	case 2, 3:
		m.w.resume()
	case 4:
		m.w.undo()
	}
}

// Check runs after every action.
func (m *rolloutMachine) Check(t *rapid.T) {
	m.w.check()
	if len(m.w.violations) > 0 {
		t.Fatalf("%s", m.w.violations[0])
	}
}

func runRollout(f rolloutFaults) func(*rapid.T) {
	return func(t *rapid.T) {
		m := &rolloutMachine{w: newRolloutWorld(rolloutSetupGen(t), f)}
		t.Repeat(rapid.StateMachineActions(m))
		m.w.settle()
		if len(m.w.violations) > 0 {
			t.Fatalf("%s", m.w.violations[0])
		}
	}
}

// TestRolloutProperties is the rapid test: random worlds of 2–8 nodes, random interleavings of
// planner runs, pair steps, readiness flips and cordons; invariants after every step,
// convergence at the end.
func TestRolloutProperties(t *testing.T) {
	startedBesideUnavailable, pausedRuns, rollbackIntents, canaryWaits = 0, 0, 0, 0
	rapid.Check(t, runRollout(rolloutFaults{}))
	if rollbackIntents == 0 || canaryWaits == 0 {
		t.Fatalf("%d nodes sent back, %d planner runs with the canaries soaking: the test does not exercise rollbacks and canaries", rollbackIntents, canaryWaits)
	}
	t.Logf("nodes sent back to %s: %d; planner runs with the canaries soaking: %d", simOld, rollbackIntents, canaryWaits)
	if startedBesideUnavailable == 0 {
		t.Fatal("no interleaving started a node while another was NotReady or cordoned: the test does not exercise the budget")
	}
	if pausedRuns == 0 {
		t.Fatal("no interleaving paused at the failure budget: the test does not exercise it")
	}
	t.Logf("planner runs on a rollout paused at its failure budget: %d", pausedRuns)
	t.Logf("planner runs that started nodes beside a NotReady or cordoned one: %d", startedBesideUnavailable)
}

// runSeeded drives a world from a seeded PRNG for steps actions, then settles it.
func runSeeded(seed uint64, steps int, f rolloutFaults) *rolloutWorld {
	r := rand.New(rand.NewPCG(seed, 0x6b6d6d))
	n := 2 + r.IntN(7)
	s := rolloutSetup{n: n, unlabelled: make([]bool, n), skip: make([]bool, n), notReady: make([]bool, n), bad: make([]bool, n)}
	for i := range n {
		s.unlabelled[i], s.skip[i], s.notReady[i], s.bad[i] = r.Float64() < 0.2, r.Float64() < 0.15, r.Float64() < 0.15, r.Float64() < 0.25
	}
	if r.IntN(3) > 0 {
		mf := intstr.FromInt32(int32(1 + r.IntN(n)))
		s.maxFailed = &mf
	}
	s.validates, s.badValidation = r.IntN(2) == 0, make([]bool, n)
	for i := range n {
		s.badValidation[i] = r.Float64() < 0.2
	}
	if r.IntN(2) == 0 {
		s.maxUnavailable = intstr.FromString(fmt.Sprintf("%d%%", []int{10, 25, 34, 50, 75, 100}[r.IntN(6)]))
	} else {
		s.maxUnavailable = intstr.FromInt32(int32(1 + r.IntN(n)))
	}
	if r.IntN(3) == 0 {
		s.canaryCount, s.soakMinutes = 1+r.IntN(2), r.IntN(6)
	}
	s.rollbackFailed = r.IntN(2) == 0
	w := newRolloutWorld(s, f)
	for range steps {
		switch x := r.IntN(22); {
		case x < 6:
			w.plan()
		case x < 16:
			w.advance(r.IntN(n))
		case x < 18:
			w.flipReady(r.IntN(n))
		case x < 20:
			w.flipCordon(r.IntN(n))
		case x < 21:
			w.fix(r.IntN(n))
		case r.IntN(3) == 0:
			w.undo()
		default:
			w.resume()
		}
		w.check()
	}
	w.settle()
	return w
}

// TestRolloutSeededSimulation replays 500 seeded worlds of 80 steps each.
func TestRolloutSeededSimulation(t *testing.T) {
	for seed := range uint64(500) {
		if w := runSeeded(seed, 80, rolloutFaults{}); len(w.violations) > 0 {
			t.Fatalf("seed %d: %s", seed, w.violations[0])
		}
	}
}

// TestRolloutGoesNodeByNode pins one trace: four Ready nodes, maxUnavailable 1, the controllers
// run in rounds; the nodes upgrade one at a time in name order.
func TestRolloutGoesNodeByNode(t *testing.T) {
	s := rolloutSetup{n: 4, unlabelled: make([]bool, 4), skip: make([]bool, 4), notReady: make([]bool, 4), bad: make([]bool, 4), maxUnavailable: intstr.FromInt32(1)}
	w := newRolloutWorld(s, rolloutFaults{})
	var order []string
	for range 40 {
		w.plan()
		for i := range w.nodes {
			w.advance(i)
		}
		w.check()
		for _, n := range w.nodes {
			if n.done() && !strings.Contains(strings.Join(order, ","), n.name) {
				order = append(order, n.name)
			}
		}
	}
	if got := strings.Join(order, ","); got != "n0,n1,n2,n3" {
		t.Fatalf("upgrade order %s, want n0,n1,n2,n3", got)
	}
	if len(w.violations) > 0 {
		t.Fatal(w.violations[0])
	}
}

var rolloutFaultCases = []struct {
	name       string
	fault      rolloutFaults
	invariants []string // the failure must name one of these
}{
	{"the planner ignores maxUnavailable", rolloutFaults{ignoresBudget: true}, []string{"invariant maxUnavailable"}},
	{"the planner ignores NotReady and cordoned nodes", rolloutFaults{ignoresUnavailable: true}, []string{"invariant unavailable", "invariant maxUnavailable"}},
	// Ignoring the skip label also resolves a percentage against the skipped nodes too.
	{"the planner ignores the skip label", rolloutFaults{ignoresSkip: true}, []string{"invariant skip", "invariant maxUnavailable"}},
	{"a node unloads before its device plugin pod leaves", rolloutFaults{unloadsBeforeDPLeaves: true}, []string{"invariant device plugin"}},
	{"the planner does not pause at the failure budget", rolloutFaults{ignoresFailureBudget: true}, []string{"invariant budget", "invariant pause status"}},
	{"the planner does not count a failed node", rolloutFaults{failedNotCounted: true}, []string{"invariant maxUnavailable", "invariant budget", "invariant pause status", "invariant validation"}},
	{"the planner counts a node upgraded before its validation succeeded", rolloutFaults{skipsValidation: true}, []string{"invariant maxUnavailable", "invariant convergence", "invariant canary"}},
	{"the planner counts a node upgraded before its device plugin is back", rolloutFaults{ignoresDevicePlugin: true}, []string{"invariant maxUnavailable", "invariant validation", "invariant canary"}},
	{"a node other than a canary starts before the canaries soaked", rolloutFaults{ignoresSoak: true}, []string{"invariant canary"}},
	{"the planner forgets a rollback in progress", rolloutFaults{forgetsRollback: true}, []string{"invariant budget", "invariant rollback", "invariant undo"}},
	{"a rollback loads the old version before unloading the new one", rolloutFaults{rollbackLoadsFirst: true}, []string{"invariant unload first"}},
}

// namesOneOf says whether a failure message names one of the invariants.
func namesOneOf(msg string, invariants []string) bool {
	for _, inv := range invariants {
		if strings.Contains(msg, inv+":") {
			return true
		}
	}
	return false
}

// TestRolloutSeededFaultsAreCaught requires rapid to find a counterexample for each broken
// variant, failing on the invariant the variant breaks.
func TestRolloutSeededFaultsAreCaught(t *testing.T) {
	rapidtb.SetFlag(t, "rapid.nofailfile", "true")
	rapidtb.SetFlag(t, "rapid.shrinktime", "3s")
	rapidtb.SetFlag(t, "rapid.checks", "1000") // it stops at the first counterexample; the budget's need a bad node
	for _, tc := range rolloutFaultCases {
		t.Run(tc.name, func(t *testing.T) {
			rec := rapidtb.New(t)
			rapid.Check(rec, runRollout(tc.fault))
			if !rec.Failed() {
				t.Fatalf("rapid found no counterexample for the fault %q", tc.name)
			}
			all := rec.Messages()
			t.Logf("counterexample (shrunk): %s", all)
			if !namesOneOf(all, tc.invariants) {
				t.Fatalf("rapid failed, but not on %v:\n%s", tc.invariants, rec.Messages())
			}
		})
	}
}

// TestRolloutSeededSimulationCatchesFaults requires the seeded simulation to catch each fault too.
func TestRolloutSeededSimulationCatchesFaults(t *testing.T) {
	for _, tc := range rolloutFaultCases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(500) {
				w := runSeeded(seed, 80, tc.fault)
				if len(w.violations) == 0 {
					continue
				}
				if !namesOneOf(w.violations[0], tc.invariants) {
					t.Fatalf("seed %d failed, but not on %v: %s", seed, tc.invariants, w.violations[0])
				}
				return
			}
			t.Fatalf("no seed caught the fault %q", tc.name)
		})
	}
}

// towards keeps the intents to version.
func towards(intents []Intent, version string) []Intent {
	var out []Intent
	for _, it := range intents {
		if it.Version == version {
			out = append(out, it)
		}
	}
	return out
}

// undo is the user's kubectl kmm rollout undo.
func (w *rolloutWorld) undo() {
	w.undos++
	w.undoPending = true
	w.log("user: undo %d", w.undos)
}

// modelCanary updates the test's model of the canary from what the planner is about to see: the
// soak counts from when every canary was last seen done, and passes for good once it lasted soak.
func (w *rolloutWorld) modelCanary() {
	if len(w.canaries) == 0 || w.canaryPassed {
		return
	}
	for _, name := range w.canaries {
		if !w.node(name).done() {
			w.soakSince = nil
			return
		}
	}
	if w.soakSince == nil {
		t := w.now
		w.soakSince = &t
	}
	canaryWaits++
	if !w.now.Before(w.soakSince.Add(w.soak)) {
		w.canaryPassed = true
		w.log("model: the canaries %v soaked since %s", w.canaries, w.soakSince.Format(time.TimeOnly))
	}
}

// modelRollback updates the test's model of the rollbacks: the previous version is known once a
// plan saw a node run it; a resume ends an undo, and a new undo (seen after the resume) starts one
// when the previous version is known.
func (w *rolloutWorld) modelRollback(resumed bool) {
	for _, n := range w.nodes {
		if n.state == kmmv1beta1.StateLoaded && n.loaded == simOld {
			w.previousKnown = true
		}
	}
	if resumed {
		w.undoActive = false
	}
	if w.undoPending {
		w.undoActive, w.undoPending = w.previousKnown, false
	}
}

// checkIntents checks the planner's intents against the canary and rollback models before they
// apply: a node starts towards the new version only once the canaries soaked (or is one), and
// goes back to the old one only during an undo, or when it failed while paused with rollbackFailed.
func (w *rolloutWorld) checkIntents(intents []Intent) {
	for _, it := range intents {
		n := w.node(it.Node)
		if it.Version == simOld {
			rollbackIntents++
		}
		switch {
		case it.Version == simNew && len(w.canaries) > 0 && !w.canaryPassed && !slices.Contains(w.canaries, n.name) && !n.inProgress() && !n.rollingBack():
			w.violate("invariant canary: %s started before the canaries %v soaked %v: %s", n.name, w.canaries, w.soak, w.describe())
		case it.Version == simNew && w.undoActive && !n.inProgress() && !n.rollingBack():
			w.violate("invariant undo: %s started towards %s during an undo: %s", n.name, simNew, w.describe())
		case it.Version == simOld && !w.undoActive && (!w.rollbackFailed || !w.modelPaused || !n.failed()):
			w.violate("invariant rollback: %s sent back to %s, neither failed while paused with rollbackFailed nor in an undo: %s", n.name, simOld, w.describe())
		}
	}
}

// checkRolledBack checks, after the intents applied, that a rollout paused at its budget with
// rollbackFailed left no failed node on the new version (the previous version being known).
func (w *rolloutWorld) checkRolledBack() {
	if !w.rollbackFailed || !w.modelPaused || !w.previousKnown || w.undoActive {
		return
	}
	for _, n := range w.nodes {
		if n.failed() {
			w.violate("invariant rollback: %s is UpgradeFailed and paused with rollbackFailed, but not sent back: %s", n.name, w.describe())
		}
	}
}

// TestRolloutUndoGoesBackNodeByNode pins one trace: three Ready nodes roll out v2 one at a time,
// then the user undoes the rollout: each node unloads v2 and loads v1 again, one at a time, in
// name order.
func TestRolloutUndoGoesBackNodeByNode(t *testing.T) {
	s := rolloutSetup{n: 3, unlabelled: make([]bool, 3), skip: make([]bool, 3), notReady: make([]bool, 3), bad: make([]bool, 3), maxUnavailable: intstr.FromInt32(1)}
	w := newRolloutWorld(s, rolloutFaults{})
	w.rounds()
	for _, n := range w.nodes {
		if !n.done() {
			t.Fatalf("%s did not reach v2: %s", n.name, w.describe())
		}
	}
	w.undo()
	var order []string
	for range 40 {
		w.plan()
		for i := range w.nodes {
			w.advance(i)
			w.check()
		}
		for _, n := range w.nodes {
			if n.state == kmmv1beta1.StateLoaded && n.loaded == simOld && !slices.Contains(order, n.name) {
				order = append(order, n.name)
			}
		}
	}
	if got := strings.Join(order, ","); got != "n0,n1,n2" {
		t.Fatalf("rollback order %s, want n0,n1,n2: %s", got, w.describe())
	}
	if len(w.violations) > 0 {
		t.Fatal(w.violations[0])
	}
	if rb := w.status.Rollback; rb == nil || rb.Reason != kmmv1beta1.ReasonRollbackUndo || w.status.NodesByUpgradeState[kmmv1beta1.RolledBack] != 3 {
		t.Fatalf("status %+v: want an undo with three nodes RolledBack", w.status)
	}
}
