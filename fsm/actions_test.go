package fsm

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"pgregory.net/rapid"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// The actions of the model world: every event, controller run, worker outcome and API refusal an
// interleaving is made of. rapid draws them at random (property_test.go); the explorer tries every
// one of them, with every choice, in every state it reaches (explore_test.go). Both run these same
// functions: an action asks its chooser for each choice it makes.

// chooser makes an action's choices.
type chooser interface {
	// oneOf returns one of options ("" when there are none: the action does nothing).
	oneOf(label string, options []string) string
	// maybe returns "" or one of options: rapid mostly "", the explorer tries all.
	maybe(label string, options []string) string
	// seconds returns how far the clock moves: rapid draws 1 to 600 s; the explorer takes the step
	// to the world's next deadline (deadline, 0 when there is none: the clock stays).
	seconds(label string, deadline int) int
}

// action is one kind of step of the world.
type action struct {
	name string
	// in says whether the action exists in a world of this configuration (nil: always).
	in  func(cfg *worldConfig) bool
	run func(w *world, c chooser)
}

func withModule(key string) func(*worldConfig) bool {
	return func(cfg *worldConfig) bool { return slices.Contains(cfg.modules, key) }
}

// modelActions is the action set of the model.
var modelActions = []action{
	// Module edits by the user.
	// CreateModule creates a deleted Module again, once its finalizer let the old one go (no NMC
	// has an entry for it any more).
	{name: "CreateModule", run: func(w *world, c chooser) {
		key := c.oneOf("module", w.cfg.modules)
		sm := w.modules[key]
		if !sm.exists && w.released(key) {
			sm.exists, sm.gen = true, sm.gen+1
			if key == modVersion {
				sm.version = fmt.Sprintf("v%d", sm.gen)
			}
		}
	}},
	{name: "EditModuleImage", in: withModule(modPlain), run: func(w *world, _ chooser) {
		if sm := w.modules[modPlain]; sm.exists {
			sm.gen++
		}
	}},
	// RevertModuleImage puts the previous image back, as an administrator undoing an edit does.
	{name: "RevertModuleImage", in: withModule(modPlain), run: func(w *world, _ chooser) {
		if sm := w.modules[modPlain]; sm.exists && sm.gen > 1 {
			sm.gen--
		}
	}},
	// BreakOrFixModule gives the plain Module a config no worker can act on (one only the worker
	// refuses, or one the operator's own check refuses), or a working one again.
	{name: "BreakOrFixModule", in: withModule(modPlain), run: func(w *world, c chooser) {
		sm := w.modules[modPlain]
		if !sm.exists {
			return
		}
		if sm.broken != "" {
			sm.broken = ""
		} else {
			sm.broken = c.oneOf("broken", []string{"worker", "operator"})
		}
		sm.gen++
	}},
	{name: "BumpModuleVersion", in: withModule(modVersion), run: func(w *world, _ chooser) {
		if sm := w.modules[modVersion]; sm.exists {
			sm.gen++
			sm.version = fmt.Sprintf("v%d", sm.gen)
		}
	}},
	{name: "DeleteModule", run: func(w *world, c chooser) {
		w.modules[c.oneOf("module", w.cfg.modules)].exists = false
	}},
	// Nodes.
	{name: "RebootNode", run: func(w *world, c chooser) {
		w.reboot(c.oneOf("node", w.cfg.nodes))
	}},
	{name: "UpgradeKernel", run: func(w *world, c chooser) {
		n := c.oneOf("node", w.cfg.nodes)
		w.nodes[n].kernel = c.oneOf("kernel", w.cfg.kernels)
		w.reboot(n)
	}},
	{name: "FlapNotReady", run: func(w *world, c chooser) {
		w.nodes[c.oneOf("node", w.cfg.nodes)].ready = false
	}},
	{name: "FlapReady", run: func(w *world, c chooser) {
		if sn := w.nodes[c.oneOf("node", w.cfg.nodes)]; !sn.ready {
			sn.ready, sn.readySince = true, w.now
		}
	}},
	// FlapNode is a NotReady/Ready flap without a reboot: the Ready transition time moves, the
	// kernel keeps its modules.
	{name: "FlapNode", run: func(w *world, c chooser) {
		sn := w.nodes[c.oneOf("node", w.cfg.nodes)]
		sn.ready, sn.readySince = true, w.now.Add(time.Second)
	}},
	// Cordon cordons or uncordons a node, as an administrator does: uncordoning lifts kmm's cordon too.
	{name: "Cordon", run: func(w *world, c chooser) {
		n := c.oneOf("node", w.cfg.nodes)
		sn := w.nodes[n]
		sn.cordoned = !sn.cordoned
		delete(w.kmmCordon, n)
	}},
	// SetVersionLabel is the user moving the version-module label; with an automatic rollout the
	// rollout does it.
	{name: "SetVersionLabel", in: func(cfg *worldConfig) bool { return withModule(modVersion)(cfg) && !cfg.automatic },
		run: func(w *world, c chooser) {
			sn := w.nodes[c.oneOf("node", w.cfg.nodes)]
			ns, name := splitKey(modVersion)
			if c.oneOf("label", []string{"set", "remove"}) == "remove" || !w.modules[modVersion].exists {
				delete(sn.labels, kmmv1beta1.ModuleVersionLabel(ns, name))
				return
			}
			sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = w.modules[modVersion].version
		}},
	// WorkloadScheduled puts a workload pod the drain selects on a node that has none and is not
	// cordoned (the scheduler's choice), with or without a PodDisruptionBudget and a finalizer.
	{name: "WorkloadScheduled", in: func(cfg *worldConfig) bool { return cfg.drain }, run: func(w *world, c chooser) {
		var free []string
		for _, n := range w.cfg.nodes {
			if w.workloads[n] == nil && !w.nodes[n].cordoned {
				free = append(free, n)
			}
		}
		n := c.oneOf("node", free)
		if n == "" {
			return
		}
		guarded := c.oneOf("kind", []string{"plain", "guarded"}) == "guarded"
		w.workloads[n] = &simWorkload{pdb: guarded, finalizer: guarded}
	}},
	// ResourceClaims. ClaimAllocated is kube-scheduler allocating a claim of a Module's DRA driver
	// on a node where the driver runs (it publishes the node's devices); ClaimReleased is the
	// resource claim controller deallocating one once no pod uses it.
	{name: "ClaimAllocated", in: func(cfg *worldConfig) bool { return cfg.dra }, run: func(w *world, c chooser) {
		var where []string
		for k, on := range w.dpPods {
			if _, key, _ := strings.Cut(k, "/"); on && !w.claims[k] && w.hasDRA(key) {
				where = append(where, k)
			}
		}
		slices.Sort(where)
		if k := c.oneOf("driver", where); k != "" {
			w.claims[k] = true
		}
	}},
	{name: "ClaimReleased", in: func(cfg *worldConfig) bool { return cfg.dra }, run: func(w *world, c chooser) {
		if k := c.oneOf("claim", sortedKeys(w.claims)); k != "" {
			delete(w.claims, k)
		}
	}},
	// Worker pods.
	{name: "WorkerSucceeds", run: func(w *world, c chooser) {
		if p := runningPod(w, c); p != nil {
			w.finishPod(p, true)
		}
	}},
	{name: "WorkerFails", run: func(w *world, c chooser) {
		if p := runningPod(w, c); p != nil {
			w.finishPod(p, false)
		}
	}},
	// HookFails fails the hook of a running pod of a Module with hooks.
	{name: "HookFails", in: func(cfg *worldConfig) bool { return cfg.hooks }, run: func(w *world, c chooser) {
		if p := runningPod(w, c); p != nil {
			w.failHook(p)
		}
	}},
	// ReloadLoadHalfFails ends a running reload pod whose unload half succeeded and whose load
	// half failed (WorkerFails fails a reload's unload half).
	{name: "ReloadLoadHalfFails", run: func(w *world, c chooser) {
		if p := runningPod(w, c); p != nil && p.action == contract.ActionReload {
			w.failReloadLoadHalf(p)
		}
	}},
	// WorkerHangs makes a running pod never finish unless an action finishes it.
	{name: "WorkerHangs", run: func(w *world, c chooser) {
		if p := runningPod(w, c); p != nil {
			p.hung = true
		}
	}},
	{name: "WorkerEvicted", run: func(w *world, c chooser) {
		if p := runningPod(w, c); p != nil {
			delete(w.pods, p.name)
		}
	}},
	// Controllers.
	{name: "ReconcileModule", run: func(w *world, c chooser) {
		w.reconcileModule(c.oneOf("module", w.cfg.modules))
	}},
	// ReconcileNMC runs the NMC controller on fresh data; the API server may refuse one of its
	// writes: the status (a conflict), the worker pod (a policy, a quota) or the cordon or uncordon.
	{name: "ReconcileNMC", run: func(w *world, c chooser) {
		n := c.oneOf("node", w.cfg.nodes)
		switch c.maybe("refused", []string{"status", "pod", "node"}) {
		case "status":
			w.conflict = true // (the reconcile then does nothing: it retries on fresh data)
		case "pod":
			w.refuse = true
		case "node":
			w.refuseNode = true
		}
		w.reconcileNMC(n, 0)
		w.conflict, w.refuse, w.refuseNode = false, false, false
	}},
	{name: "ReconcileNMCFromStaleCache", in: func(cfg *worldConfig) bool { return cfg.history > 1 }, run: func(w *world, c chooser) {
		n := c.oneOf("node", w.cfg.nodes)
		ages := make([]string, 0, w.cfg.history-1)
		for age := 1; age < w.cfg.history; age++ {
			ages = append(ages, fmt.Sprint(age))
		}
		var age int
		_, _ = fmt.Sscan(c.oneOf("age", ages), &age)
		w.reconcileNMC(n, age)
	}},
	{name: "ReconcileVersionLabels", in: withModule(modVersion), run: func(w *world, c chooser) {
		w.reconcileLabels(c.oneOf("node", w.cfg.nodes))
	}},
	{name: "ReconcileRollout", in: func(cfg *worldConfig) bool { return cfg.automatic }, run: func(w *world, _ chooser) {
		w.reconcileRollout()
	}},
	{name: "ReconcileDaemonSets", run: func(w *world, c chooser) {
		w.reconcileDaemonSets(c.oneOf("node", w.cfg.nodes))
	}},
	// ControllersCatchUp runs every controller once on every node, as happens when events settle.
	{name: "ControllersCatchUp", run: func(w *world, _ chooser) {
		w.catchUp()
	}},
	// RestartOperator drops every cache: the next reconciles start from what the API server holds.
	{name: "RestartOperator", run: func(w *world, _ chooser) {
		w.history = nil
		w.remember()
	}},
	{name: "Tick", run: func(w *world, c chooser) {
		w.now = w.now.Add(time.Duration(c.seconds("seconds", w.nextDeadline())) * time.Second)
	}},
}

// released says whether no NMC has an entry for the Module any more: the Module→NMC controller then
// removes the finalizer of a deleted Module, and only then can a Module of that name be created.
func (w *world) released(key string) bool {
	for _, nmc := range w.nmcs {
		_, spec := nmc.spec[key]
		_, status := nmc.status[key]
		if spec || status {
			return false
		}
	}
	return true
}

// runningPod picks one of the running worker pods (nil when none runs).
func runningPod(w *world, c chooser) *simPod {
	var running []string
	for name, p := range w.pods {
		if p.phase == PodRunning {
			running = append(running, name)
		}
	}
	slices.Sort(running)
	if name := c.oneOf("pod", running); name != "" {
		return w.pods[name]
	}
	return nil
}

// actionsFor returns the actions that exist in a world of the configuration.
func actionsFor(cfg *worldConfig) []action {
	var out []action
	for _, a := range modelActions {
		if a.in == nil || a.in(cfg) {
			out = append(out, a)
		}
	}
	return out
}

// nextDeadline is how many seconds from now the next deadline falls (0 when none is ahead): the
// next moment at which a decision or a property may change by the clock alone. The deadlines are
// the back-off of a backing-off pair (as the controllers count it, and as the back-off property
// does), the upgrade grace, the worker timeout of a running pod, the drain's escalations, and a
// Ready transition in the future.
func (w *world) nextDeadline() int {
	best := time.Duration(0)
	at := func(t time.Time, d time.Duration) {
		if ahead := t.Add(d).Sub(w.now); !t.IsZero() && ahead > 0 && (best == 0 || ahead < best) {
			best = ahead
		}
	}
	for _, sn := range w.nodes {
		at(sn.readySince, 0)
	}
	backOff := w.backOff()
	for _, nmc := range w.nmcs {
		for _, st := range nmc.status {
			switch st.State {
			case LoadBackOff, UnloadBackOff:
				at(st.LastTransitionTime.Time, backOff.Delay(st.Attempts))
			case Upgrading:
				at(st.LastTransitionTime.Time, UpgradeSpecGrace)
			}
			if st.Drain != nil {
				for _, after := range []time.Duration{0, drainJobWait * time.Second} {
					at(st.Drain.StartTime.Time, after+drainDeleteAfter*time.Second)
					at(st.Drain.StartTime.Time, after+drainForceAfter*time.Second)
				}
				at(st.Drain.StartTime.Time, drainJobWait*time.Second)
			}
		}
	}
	for _, p := range w.pods {
		if p.phase == PodRunning {
			at(p.created, w.workerTimeout())
		}
	}
	for _, r := range w.attempts {
		at(r.failed, DefaultBackOff.Delay(r.streak))
	}
	return int((best + time.Second - 1) / time.Second)
}

// startingWorld is a world an interleaving starts from, built from a fresh one by a fixed script of
// the correct controllers.
type startingWorld struct {
	name  string
	build func(w *world)
}

// The starting worlds: checkpoints of a pair's life, so that bounded interleavings from them reach
// every phase (loading, failing loads, loaded, unloading, an ordered upgrade with its drain).
var (
	rootFresh     = startingWorld{name: "fresh: nothing loaded yet, spec not written", build: func(*world) {}}
	rootAllLoaded = startingWorld{name: "settled: every pair Loaded", build: func(w *world) {
		w.settle(maxSettleRounds)
	}}
	rootLoadsFailing = startingWorld{name: "loads failing: every load failed twice, backing off", build: func(w *world) {
		w.catchUp() // (the versioned Module's entry needs its worker-pod label first: one more round)
		w.advanceUntil(func() bool {
			return w.allPairs(func(st kmmv1beta1.NodeModuleStatus) bool { return st.State == LoadBackOff && st.Attempts >= 2 })
		},
			func() {
				for range 3 {
					for _, name := range sortedKeys(w.pods) {
						if p := w.pods[name]; p.phase == PodRunning {
							w.finishPod(p, false)
						}
					}
					w.catchUp()
				}
			})
	}}
	rootUnloading = startingWorld{name: "unloading: settled, then the plain Module's image edited (deleted when it has no device plugin) and the versioned Module deleted; unload pods running",
		build: func(w *world) {
			w.settle(maxSettleRounds)
			if sm := w.modules[modPlain]; sm != nil {
				sm.gen++
				// Without a device plugin an image edit is a reload (rootBumped): delete it instead.
				sm.exists = !w.cfg.plainWithoutDevicePlugin
			}
			if sm := w.modules[modVersion]; sm != nil {
				sm.exists = false
			}
			w.advanceUntil(func() bool {
				return w.allPairs(func(st kmmv1beta1.NodeModuleStatus) bool { return st.State == Unloading }) && w.allPodsRunning()
			}, nil)
		}}
	rootReloading = startingWorld{name: "reloading: settled, then a NotReady/Ready flap; load pods running, the old config still recorded",
		build: func(w *world) {
			w.settle(maxSettleRounds)
			for _, sn := range w.nodes {
				sn.readySince = w.now
			}
			w.advanceUntil(func() bool {
				return w.allPairs(func(st kmmv1beta1.NodeModuleStatus) bool { return st.State == Loading && st.Config != nil }) && w.allPodsRunning()
			}, nil)
		}}
	rootBumped = startingWorld{name: "bumped: settled, then the plain Module's image edited; its worker pods running (reload pods without a device plugin)",
		build: func(w *world) {
			w.settle(maxSettleRounds)
			w.modules[modPlain].gen++
			w.advanceUntil(func() bool {
				for _, n := range w.cfg.nodes {
					if p := w.livePod(n, modPlain); p == nil || p.phase != PodRunning {
						return false
					}
				}
				return true
			}, nil)
		}}
	rootFromUpstream = startingWorld{name: "switched from upstream KMM: every pair's record as upstream leaves it (its config loaded in this boot, no state)",
		build: func(w *world) {
			w.settle(maxSettleRounds)
			for n, nmc := range w.nmcs {
				next := map[string]kmmv1beta1.NodeModuleStatus{}
				for key, st := range nmc.status {
					next[key] = kmmv1beta1.NodeModuleStatus{Namespace: st.Namespace, Name: st.Name, Config: st.Config,
						UpstreamBootID: fmt.Sprint(w.nodes[n].boot), LastTransitionTime: st.LastTransitionTime}
				}
				w.writeNMC(n).status = next
			}
		}}
	rootClaimed = startingWorld{name: "claimed: settled, then a ResourceClaim allocated on every node where a DRA driver runs",
		build: func(w *world) {
			w.settle(maxSettleRounds)
			for k, on := range w.dpPods {
				if _, key, _ := strings.Cut(k, "/"); on && w.hasDRA(key) {
					w.claims[k] = true
				}
			}
		}}
	rootUpgradeAsked = startingWorld{name: "settled at v1, then the Module bumped to v2", build: func(w *world) {
		w.settle(maxSettleRounds)
		w.bumpVersion()
	}}
	rootUpgrading = startingWorld{name: "upgrading: settled at v1, bumped to v2, the first node asked for it, drained, unloading v1", build: func(w *world) {
		w.settle(maxSettleRounds)
		w.bumpVersion()
		n0 := w.cfg.nodes[0]
		ns, name := splitKey(modVersion)
		w.nodes[n0].labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = w.modules[modVersion].version
		w.advanceUntil(func() bool {
			p := w.livePod(n0, modVersion)
			return w.nmcs[n0].status[modVersion].State == Unloading && p != nil && p.phase == PodRunning
		}, nil)
	}}
)

// bumpVersion moves the versioned Module to its next version (and image), as the user does.
func (w *world) bumpVersion() {
	sm := w.modules[modVersion]
	sm.gen++
	sm.version = fmt.Sprintf("v%d", sm.gen)
}

// advanceUntil runs the controllers (and then, if given, more), moving the clock to the next
// deadline between rounds, until done says so (at most 20 rounds: a starting world that is not
// reached panics in start).
func (w *world) advanceUntil(done func() bool, more func()) {
	for range 20 {
		w.catchUp()
		if more != nil {
			more()
		}
		if done() {
			return
		}
		w.now = w.now.Add(time.Duration(w.nextDeadline()) * time.Second)
	}
	w.violate("the starting world was not reached within 20 rounds: %s", w.describe())
}

// allPairs says whether every (node, Module) pair's status entry satisfies ok.
func (w *world) allPairs(ok func(kmmv1beta1.NodeModuleStatus) bool) bool {
	for _, n := range w.cfg.nodes {
		for _, key := range w.cfg.modules {
			if !ok(w.nmcs[n].status[key]) {
				return false
			}
		}
	}
	return true
}

// allPodsRunning says whether every pair has a running worker pod.
func (w *world) allPodsRunning() bool {
	for _, n := range w.cfg.nodes {
		for _, key := range w.cfg.modules {
			if p := w.livePod(n, key); p == nil || p.phase != PodRunning {
				return false
			}
		}
	}
	return true
}

// start builds the starting world. The correct controllers build it; a seeded fault takes over
// from there (as an operator upgrade to a broken version would), so that a counterexample is the
// steps the broken controllers take.
func (s startingWorld) start(cfg *worldConfig, f faults) *world {
	key := fmt.Sprintf("%s|%+v", s.name, *cfg)
	built, ok := startingWorldsBuilt.Load(key)
	if !ok {
		w := newWorld(cfg, faults{})
		s.build(w)
		if len(w.violations) > 0 {
			panic(fmt.Sprintf("starting world %q: %v", s.name, w.violations))
		}
		w.history = nil
		w.remember()
		built, _ = startingWorldsBuilt.LoadOrStore(key, w)
	}
	w := built.(*world).clone()
	w.cfg, w.faults, w.fired = cfg, f, nil
	return w
}

// startingWorldsBuilt keeps each starting world built once per configuration (building one settles
// a world; rapid starts thousands of interleavings from them). They are only cloned, never changed.
var startingWorldsBuilt sync.Map

// startingWorlds are the worlds rapid's interleavings start from.
var startingWorlds = []startingWorld{rootFresh, rootAllLoaded, rootLoadsFailing, rootReloading, rootUnloading, rootBumped, rootUpgradeAsked, rootUpgrading, rootFromUpstream, rootClaimed}

// rapidChooser draws the choices with rapid.
type rapidChooser struct{ t *rapid.T }

func (c rapidChooser) oneOf(label string, options []string) string {
	if len(options) == 0 {
		return ""
	}
	return rapid.SampledFrom(options).Draw(c.t, label)
}

func (c rapidChooser) maybe(label string, options []string) string {
	if rapid.IntRange(0, 4).Draw(c.t, label+"?") > 0 {
		return ""
	}
	return c.oneOf(label, options)
}

func (c rapidChooser) seconds(label string, deadline int) int {
	if deadline > 0 && rapid.Bool().Draw(c.t, label+" to the next deadline") {
		return deadline
	}
	return rapid.IntRange(1, 600).Draw(c.t, label)
}

// rapidActions adapts the action set to rapid's state machine: each action runs with rapid's
// choices, and the invariants are checked after every one.
func rapidActions(w *world) map[string]func(*rapid.T) {
	out := map[string]func(*rapid.T){}
	for _, a := range actionsFor(w.cfg) {
		out[a.name] = func(t *rapid.T) { a.run(w, rapidChooser{t}) }
	}
	out[""] = func(t *rapid.T) {
		w.remember()
		w.check()
		if len(w.violations) > 0 {
			t.Fatalf("%s", w.violations[0])
		}
	}
	return out
}

// sortedKeys is maps.Keys, sorted.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
