package fsm

import (
	"cmp"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
)

// The explorer walks every interleaving of the model's actions (actions_test.go) from a few
// starting worlds, breadth first, up to a depth: every action with every choice it can make, in
// every state reached, each state once (by its canonical form, canon_test.go). Every invariant is
// checked in every state, including convergence (the state settles when events stop); the first
// violation found is a shortest counterexample, replayed as a readable trace.

// exploreSpec is a world configuration, its starting worlds and its default depth.
type exploreSpec struct {
	cfg   worldConfig
	roots []startingWorld
	depth int
}

// exploreSpecs are the explored configurations.
var exploreSpecs = []exploreSpec{
	{
		cfg: worldConfig{name: "1 node x 2 Modules", nodes: []string{"n0"}, modules: []string{modPlain, modVersion},
			kernels: []string{kernelA, kernelB, kernelNoMap}, drain: true, history: 2},
		roots: []startingWorld{rootFresh, rootAllLoaded, rootLoadsFailing, rootReloading, rootUnloading, rootUpgrading, rootFromUpstream},
		depth: 3,
	},
	{
		cfg: worldConfig{name: "2 nodes x 1 versioned Module (device plugin, drain, automatic rollout, maxUnavailable 1)",
			nodes: []string{"n0", "n1"}, modules: []string{modVersion}, kernels: []string{kernelA, kernelB, kernelNoMap},
			drain: true, automatic: true, maxUnavailable: 1, history: 2},
		roots: []startingWorld{rootAllLoaded, rootUpgradeAsked, rootUpgrading},
		depth: 3,
	},
	{
		cfg: worldConfig{name: "1 node x 1 versioned Module with postLoad and preUnload hooks (device plugin, drain)",
			nodes: []string{"n0"}, modules: []string{modVersion}, kernels: []string{kernelA, kernelB, kernelNoMap},
			drain: true, history: 2, hooks: true},
		roots: []startingWorld{rootFresh, rootAllLoaded, rootUpgradeAsked, rootUpgrading},
		depth: 4,
	},
	{
		cfg: worldConfig{name: "1 node x 2 Modules with DRA drivers (ResourceClaims, drain)", nodes: []string{"n0"}, modules: []string{modPlain, modVersion},
			kernels: []string{kernelA, kernelB, kernelNoMap}, drain: true, history: 2, dra: true},
		roots: []startingWorld{rootClaimed, rootAllLoaded, rootReloading, rootUpgradeAsked, rootUpgrading},
		depth: 3,
	},
	{
		cfg: worldConfig{name: "1 node x 1 plain Module without a device plugin (image bumps reload)", nodes: []string{"n0"}, modules: []string{modPlain},
			kernels: []string{kernelA, kernelB, kernelNoMap}, history: 2, plainWithoutDevicePlugin: true},
		roots: []startingWorld{rootAllLoaded, rootBumped, rootLoadsFailing},
		depth: 3,
	},
}

// exploreStep is one step of a path: an action and the choices it made.
type exploreStep struct {
	action int
	script string // one byte per choice
}

// counterexample is a shortest path to a violation.
type counterexample struct {
	root    int
	steps   []exploreStep
	settled bool // the violation shows when events stop after the last step
	message string
}

// exploreResult is what an exploration found.
type exploreResult struct {
	cfg       string
	states    int   // distinct states reached
	perLevel  []int // new states per depth
	depth     int   // the deepest level fully explored
	runs      int   // actions run (successors computed)
	elapsed   time.Duration
	edges     map[Edge]int // the transitions taken, with the first depth that took each
	violation *counterexample
	trace     string
}

type explorer struct {
	spec    *exploreSpec
	faults  faults
	actions []action
	workers int

	roots  []int // per state: its root
	parent []int32
	step   []exploreStep
	seen   map[stateHash]int32
	memo   settleMemo
	edges  map[Edge]int
	mu     sync.Mutex
	found  *candidate // the least violation of the current level
	result exploreResult
}

// candidate is a state (or a violation) found at the current level, before it gets its number.
type candidate struct {
	order   [3]int // parent's position in the frontier, action, choice: the order of discovery
	parent  int32
	step    exploreStep
	w       *world
	hash    stateHash
	message string
	settled bool
}

func newExplorer(spec *exploreSpec, f faults) *explorer {
	return &explorer{spec: spec, faults: f, actions: actionsFor(&spec.cfg), workers: runtime.GOMAXPROCS(0),
		seen: map[stateHash]int32{}, memo: settleMemo{m: map[stateHash]settleOutcome{}}, edges: map[Edge]int{}}
}

// explore runs breadth first to depth, or until the first level with a violation.
func (x *explorer) explore(depth int) exploreResult {
	// The frontier is a large live heap that the collector would scan over and over: collect less
	// often (memory is not what bounds the exploration).
	defer debug.SetGCPercent(debug.SetGCPercent(800))
	start := time.Now()
	x.result = exploreResult{cfg: x.spec.cfg.name}
	var frontier []*world
	var ids []int32
	for i := range x.spec.roots {
		w := x.root(i)
		w.fired = nil
		w.remember()
		w.check()
		h := w.hash()
		if _, dup := x.seen[h]; dup {
			continue
		}
		id := x.add(h, -1, exploreStep{action: -1}, i)
		if len(w.violations) > 0 {
			x.found = &candidate{parent: id, step: exploreStep{action: -1}, message: w.violations[0]}
			break
		}
		frontier, ids = append(frontier, w), append(ids, id)
	}
	x.result.perLevel = append(x.result.perLevel, len(frontier))
	if x.found == nil {
		x.checkConvergence(frontier, ids)
	}
	for level := 1; level <= depth && x.found == nil && len(frontier) > 0; level++ {
		next := x.expand(frontier, ids, level)
		if x.found != nil {
			break
		}
		frontier, ids = frontier[:0], ids[:0]
		for _, c := range next {
			id := x.add(c.hash, c.parent, c.step, x.roots[c.parent])
			frontier, ids = append(frontier, c.w), append(ids, id)
		}
		x.result.perLevel = append(x.result.perLevel, len(next))
		x.checkConvergence(frontier, ids)
		if x.found == nil {
			x.result.depth = level
		}
	}
	x.result.states = len(x.parent)
	x.result.elapsed = time.Since(start)
	x.result.edges = x.edges
	if x.found != nil {
		x.result.violation = x.counterexample(x.found)
		x.result.trace = x.replay(x.result.violation)
	}
	return x.result
}

// root builds starting world i. The correct controllers build it; a seeded fault takes over from
// there (as an operator upgrade to a broken version would), so that a counterexample is the steps
// the broken controllers take.
func (x *explorer) root(i int) *world {
	cfg := x.spec.cfg
	return x.spec.roots[i].start(&cfg, x.faults)
}

func (x *explorer) add(h stateHash, parent int32, s exploreStep, root int) int32 {
	id := int32(len(x.parent))
	x.seen[h] = id
	x.parent = append(x.parent, parent)
	x.step = append(x.step, s)
	x.roots = append(x.roots, root)
	return id
}

// expand computes every successor of the frontier and returns the new states in the order of
// their discovery (so that numbering, and the counterexample chosen, do not depend on scheduling).
func (x *explorer) expand(frontier []*world, ids []int32, depth int) []*candidate {
	level := map[stateHash]*candidate{}
	var levelMu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	for range x.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			edges := map[Edge]int{}
			runs := 0
			for pos := range work {
				for ai := range x.actions {
					x.successors(frontier[pos], ai, func(script string, choice int, nw *world) {
						runs++
						for _, e := range nw.fired {
							edges[e]++
						}
						nw.fired = nil
						c := &candidate{order: [3]int{pos, ai, choice}, parent: ids[pos], step: exploreStep{action: ai, script: script}}
						if len(nw.violations) > 0 {
							c.message = nw.violations[0]
							x.offer(c)
							return
						}
						h := nw.hash()
						if _, old := x.seen[h]; old {
							return
						}
						c.w, c.hash = nw, h
						levelMu.Lock()
						if prev, ok := level[h]; !ok || less(c.order, prev.order) {
							level[h] = c
						}
						levelMu.Unlock()
					})
				}
			}
			x.mu.Lock()
			for e := range edges {
				if _, ok := x.edges[e]; !ok {
					x.edges[e] = depth
				}
			}
			x.result.runs += runs
			x.mu.Unlock()
		}()
	}
	for pos := range frontier {
		work <- pos
	}
	close(work)
	wg.Wait()
	out := slices.Collect(maps.Values(level))
	slices.SortFunc(out, func(a, b *candidate) int { return compareOrder(a.order, b.order) })
	return out
}

func compareOrder(a, b [3]int) int {
	return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]), cmp.Compare(a[2], b[2]))
}

func less(a, b [3]int) bool { return compareOrder(a, b) < 0 }

// offer keeps the violation found first in discovery order.
func (x *explorer) offer(c *candidate) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.found == nil || less(c.order, x.found.order) {
		x.found = c
	}
}

// successors runs action ai on copies of w with every sequence of choices it can make.
func (x *explorer) successors(w *world, ai int, emit func(script string, choice int, nw *world)) {
	var script []byte
	for choice := 0; ; choice++ {
		c := &scriptChooser{script: script}
		nw := w.clone()
		x.actions[ai].run(nw, c)
		nw.remember()
		nw.check()
		emit(string(c.taken), choice, nw)
		i := len(c.taken) - 1
		for i >= 0 && int(c.taken[i])+1 >= c.widths[i] {
			i--
		}
		if i < 0 {
			return
		}
		script = append(c.taken[:i:i], c.taken[i]+1)
	}
}

// checkConvergence is invariant 7 (and 5, and the drain's end) in every new state: when the
// events stop, the state settles as checkConverged wants.
func (x *explorer) checkConvergence(frontier []*world, ids []int32) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range x.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pos := range work {
				if msg := x.converges(frontier[pos]); msg != "" {
					x.offer(&candidate{order: [3]int{pos, -1, 0}, parent: ids[pos], step: exploreStep{action: -1}, message: msg, settled: true})
				}
			}
		}()
	}
	for pos := range frontier {
		work <- pos
	}
	close(work)
	wg.Wait()
}

// settleOutcome is what settling from a state gives: the rounds it takes and the first violation.
type settleOutcome struct {
	rounds  int
	message string
}

// settleMemo remembers the outcome of settling from each state met while settling: settling is
// deterministic, so a state met again settles the same way.
type settleMemo struct {
	mu sync.Mutex
	m  map[stateHash]settleOutcome
}

// converges settles a copy of w and returns the first violation ("" when it converges as it must).
func (x *explorer) converges(w *world) string {
	c := w.clone()
	c.stopEvents()
	var path []stateHash
	var out settleOutcome
	for round := 0; ; round++ {
		h := c.hash()
		x.memo.mu.Lock()
		known, ok := x.memo.m[h]
		x.memo.mu.Unlock()
		if ok {
			out = settleOutcome{rounds: round + known.rounds, message: known.message}
			break
		}
		path = append(path, h)
		if round >= maxSettleRounds {
			out = settleOutcome{rounds: round, message: fmt.Sprintf("invariant 7: the world did not settle within %d rounds of reconciles: %s", maxSettleRounds, c.describe())}
			break
		}
		if !c.settleRound() {
			c.check()
			c.checkConverged()
			out = settleOutcome{rounds: round}
			if len(c.violations) > 0 {
				out.message = c.violations[0]
			}
			break
		}
		if len(c.violations) > 0 {
			out = settleOutcome{rounds: round, message: c.violations[0]}
			break
		}
	}
	x.memo.mu.Lock()
	for i, h := range path {
		x.memo.m[h] = settleOutcome{rounds: out.rounds - i, message: out.message}
	}
	x.memo.mu.Unlock()
	if out.message == "" && out.rounds > maxSettleRounds {
		return fmt.Sprintf("invariant 7: the world did not settle within %d rounds of reconciles", maxSettleRounds)
	}
	return out.message
}

// counterexample walks a violation back to its root.
func (x *explorer) counterexample(c *candidate) *counterexample {
	var steps []exploreStep
	if c.step.action >= 0 {
		steps = append(steps, c.step)
	}
	for id := c.parent; id >= 0; id = x.parent[id] {
		if x.step[id].action >= 0 {
			steps = append(steps, x.step[id])
		}
	}
	slices.Reverse(steps)
	return &counterexample{root: x.roots[c.parent], steps: steps, settled: c.settled, message: c.message}
}

// replay runs a counterexample again from its root and prints it step by step, with the world
// after each step.
func (x *explorer) replay(ce *counterexample) string {
	w := x.root(ce.root)
	root := x.spec.roots[ce.root]
	var b strings.Builder
	then := ""
	if ce.settled {
		then = ", then events stop"
	}
	fmt.Fprintf(&b, "%s, from %q: %d steps%s\n", x.spec.cfg.name, root.name, len(ce.steps), then)
	w.check()
	fmt.Fprintf(&b, "      start: %s\n", w.summary())
	for i, s := range ce.steps {
		c := &scriptChooser{script: []byte(s.script)}
		x.actions[s.action].run(w, c)
		w.remember()
		w.check()
		fmt.Fprintf(&b, "  %2d. %s\n      %s\n", i+1, x.actions[s.action].name+c.label(), w.summary())
	}
	if ce.settled {
		w.settle(maxSettleRounds)
		w.check()
		w.checkConverged()
		fmt.Fprintf(&b, "  then events stop and every controller runs until nothing changes:\n      %s\n", w.summary())
	}
	fmt.Fprintf(&b, "  violation: %s\n", ce.message)
	if len(w.violations) == 0 {
		fmt.Fprintf(&b, "  (the replay shows no violation)\n")
	}
	return b.String()
}

// scriptChooser makes the choices of a script, then the first option of each further choice,
// and records what it took and how many options each choice had.
type scriptChooser struct {
	script []byte
	taken  []byte
	widths []int
	labels []string
}

func (c *scriptChooser) pick(label string, options []string) string {
	if len(options) == 0 {
		return ""
	}
	i := 0
	if pos := len(c.taken); pos < len(c.script) {
		i = int(c.script[pos])
	}
	c.taken = append(c.taken, byte(i))
	c.widths = append(c.widths, len(options))
	c.labels = append(c.labels, label+"="+options[i])
	return options[i]
}

func (c *scriptChooser) oneOf(label string, options []string) string { return c.pick(label, options) }

func (c *scriptChooser) maybe(label string, options []string) string {
	if got := c.pick(label, append([]string{"none"}, options...)); got != "none" {
		return got
	}
	return ""
}

// seconds takes the step to the next deadline: between two deadlines no decision changes by the
// clock alone.
func (c *scriptChooser) seconds(label string, deadline int) int {
	if deadline == 0 {
		return 0
	}
	c.labels = append(c.labels, fmt.Sprintf("%s=%d", label, deadline))
	return deadline
}

func (c *scriptChooser) label() string {
	if len(c.labels) == 0 {
		return ""
	}
	return "(" + strings.Join(c.labels, ", ") + ")"
}

// summary is the world in one line: per node its conditions, pairs, pods and cordon.
func (w *world) summary() string {
	var parts []string
	for _, n := range w.cfg.nodes {
		sn := w.nodes[n]
		s := n
		if !sn.ready {
			s += " NotReady"
		}
		if sn.cordoned {
			s += " cordoned"
			if key, ok := w.kmmCordon[n]; ok {
				s += "(kmm:" + key + ")"
			}
		}
		if sn.kernel != kernelA {
			s += " kernel=" + sn.kernel
		}
		var pairs []string
		for _, key := range w.cfg.modules {
			_, name := splitKey(key)
			st, ok := w.nmcs[n].status[key]
			p := name + ":"
			if ok {
				p += string(st.State)
				if st.Config != nil {
					p += "(" + imageTag(st.Config.ContainerImage) + ")"
				}
			} else {
				p += "-"
			}
			if e, ok := w.nmcs[n].spec[key]; ok {
				p += " spec=" + imageTag(e.Config.ContainerImage)
			}
			if cur, ok := sn.loaded[key]; ok {
				p += " kernel has " + imageTag(cur.ContainerImage)
			}
			if pod := w.livePod(n, key); pod != nil {
				p += fmt.Sprintf(" pod=%s#%d:%s", pod.action, pod.attempt, pod.phase)
			}
			if w.dpPods[n+"/"+key] {
				p += map[bool]string{false: " dp", true: " dra"}[w.hasDRA(key)]
			}
			if w.claims[n+"/"+key] {
				p += " claim"
			}
			pairs = append(pairs, p)
		}
		if wl := w.workloads[n]; wl != nil {
			pairs = append(pairs, "workload"+map[bool]string{true: "(terminating)"}[wl.terminating])
		}
		parts = append(parts, s+" ["+strings.Join(pairs, "; ")+"]")
	}
	return fmt.Sprintf("t+%ds ", int(w.now.Sub(t0)/time.Second)) + strings.Join(parts, "  ")
}

// imageTag is the tag of an image reference, shortened to what tells configs apart.
func imageTag(image string) string {
	_, tag, _ := strings.Cut(image, ":")
	short, _, _ := strings.Cut(tag, "-6.1.0")
	if strings.HasSuffix(tag, brokenImageTag) {
		short += brokenImageTag
	}
	return short
}

func (e Edge) String() string { return fmt.Sprintf("%s --%s--> %s", e.From, e.Trigger, e.To) }

// sortedEdges returns the edges in the order of States, then of AllTriggers, then of the target.
func sortedEdges[V any](m map[Edge]V) []Edge {
	rank := func(s State) int { return slices.Index(States, s) }
	out := slices.Collect(maps.Keys(m))
	slices.SortFunc(out, func(a, b Edge) int {
		return cmp.Or(cmp.Compare(rank(a.From), rank(b.From)), cmp.Compare(slices.Index(AllTriggers, a.Trigger), slices.Index(AllTriggers, b.Trigger)),
			cmp.Compare(rank(a.To), rank(b.To)))
	})
	return out
}
