package fsm

import (
	"fmt"
	"hash/maphash"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/semantic"
	"github.com/kmm-project/kmm/upgrade"
)

// This file is a model of the cluster: nodes with a kernel that really has modules loaded or not,
// Modules, NMCs, worker pods, device plugin or DRA driver pods, ResourceClaims allocated with a DRA
// driver's devices, workload pods an upgrade drains, and the controllers, driven by the real decision code (DecideSpec, Step, upgrade.NextLabels) and the real
// state machine. Two drivers share it and its actions (actions_test.go): rapid samples random
// interleavings (property_test.go), the explorer walks every interleaving of a small world up to a
// depth (explore_test.go). The invariants of SPEC §4 are checked after every step, and the claims
// property of issue 36: no unload or reload pod is created or runs for a Module on a node where a
// ResourceClaim of its DRA driver is allocated; while the module is in that node's kernel, no
// reconcile takes away the ready label that keeps the driver there, no drain evicts the driver and
// its DaemonSet does not go. (A claim allocated after the label went, before the DaemonSet
// controller took the driver away, is a race no decision can close: the scheduler may allocate
// from the ResourceSlices the driver published until it is gone. The unload still waits for it.)

const (
	kernelA     = "6.1.0-56-cloud-amd64"
	kernelB     = "6.1.0-57-cloud-amd64"
	kernelNoMap = "4.18.0-1.el8.x86_64" // no kernel mapping matches it
	modPlain    = "ns/plain"            // no version; has a device plugin
	modVersion  = "ns/versioned"        // ordered upgrades; has a device plugin; may drain and roll out by itself

	// The versioned Module's drain (upgradePolicy.drain): PDB-protected pods are deleted after
	// drainForceAfter, the others after drainDeleteAfter, when finalizers of stuck pods are stripped too.
	drainDeleteAfter = 60
	drainForceAfter  = 120
	// drainJobWait is the versioned Module's drain.jobs.waitSeconds; drainResource the extended
	// resource its drain.deviceUsers names.
	drainJobWait  = 300
	drainResource = "example.com/dev"
)

// worldConfig is the size and the policies of a model world.
type worldConfig struct {
	name    string
	nodes   []string
	modules []string
	kernels []string
	// drain gives the versioned Module an upgradePolicy.drain and every node a workload pod it drains.
	drain bool
	// automatic lets the rollout move the version-module labels (upgradePolicy.automatic,
	// maxUnavailable); the user then never sets them.
	automatic      bool
	maxUnavailable int
	// history is how many distinct cache contents a stale reconcile may act on, the current one included.
	history int
	// plainWithoutDevicePlugin gives the plain Module no device plugin: its image bumps are one
	// reload worker each, with the ready label kept (issue 22).
	plainWithoutDevicePlugin bool
	// dra gives the Modules that have a device plugin a DRA driver (spec.dra) instead: its pods run
	// where a device plugin's would, and ResourceClaims of its devices may be allocated on the
	// nodes where it runs (issue 36).
	dra bool
	// hooks gives the versioned Module a postLoad and a preUnload hook (spec.moduleLoader.hooks,
	// issue 40): in the model's kernel its module holds its devices once loaded, so modprobe -r
	// fails with EBUSY unless the preUnload hook released them first.
	hooks bool
}

// rapidConfig is the world rapid samples: three nodes, both Modules, the versioned one draining,
// with an automatic rollout or with labels the user sets.
func rapidConfig(automatic bool) worldConfig {
	return worldConfig{name: "rapid", nodes: []string{"n0", "n1", "n2"}, modules: []string{modPlain, modVersion},
		kernels: []string{kernelA, kernelB, kernelNoMap}, drain: true, automatic: automatic, maxUnavailable: 1, history: 4}
}

// faults are deliberately broken variants of the controllers; the seeded-fault tests check that
// the property test and the explorer catch each one.
type faults struct {
	nmcIgnoresReady           bool // the NMC decision treats every node as Ready
	specReadsNodeStatus       bool // the Module→NMC decision drops entries of NotReady nodes
	unloadIgnoresDevicePlugin bool // the NMC decision never sees the device plugin pod
	ignoresReboots            bool // the NMC decision never sees a new boot ID or Ready time
	failedEntryUnread         bool // a failed pod's config reads as empty yet known (the retry storm of issue 13)
	noWorkerTimeout           bool // worker pods never time out
	flatBackOff               bool // the back-off does not grow with the failures (10 s every time)
	podGenerateName           bool // worker pods get generated names, so the API server no longer keeps one per pair
	logSkipsTransition        bool // the status write drops the newest entry of the transition log
	cordonForgotten           bool // the drain's record does not remember that kmm cordoned the node
	rolloutIgnoresInProgress  bool // the rollout does not count nodes it started and that are not done
	rolloutDoneIgnoresCordon  bool // the rollout does not count a done node that is still cordoned (upgrade.PlanRollout's old rule)
	rolloutNeverRetargets     bool // the rollout leaves a node on its way to an older version as pending (upgrade.PlanRollout's old rule)
	onlyCreatesCheckFreshness bool // a reconcile whose status did not change relabels, cordons and drains unchecked (before issue 19)
	strandedRecordDropped     bool // an Absent record of a config still in the kernel, with no spec entry, is dropped (before the fix of issue 18)
	reloadIgnoresDevicePlugin bool // the NMC decision does not see the device plugin pod when the spec's config changed (a reload beside it)
	reloadUnloadsNewConfig    bool // a reload pod's unload half is given the new config instead of the loaded one
	drainSeesKMMPodsAsWork    bool // the drain takes kmm's worker pods for workloads (before the fix of issue 34)
	unloadIgnoresClaims       bool // the NMC decision never sees the ResourceClaims allocated on the node (Facts.Claims)
	drainMissesDeviceUsers    bool // the drain's facts leave out the resources a pod requests (deviceUsers never matches)
	jobPodsUnseen             bool // the drain's facts do not say that a Job controls a pod (jobs never waits)
	draDriverGoesWithModule   bool // a DRA driver's DaemonSets go as soon as the Module is being deleted (before the fix of issue 36)
	readyIgnoresClaims        bool // the ready label (the DRA driver's) is decided as if no ResourceClaim were allocated
	hookSkipped               bool // worker pods are made without the Module's hooks
}

type simNode struct {
	labels     map[string]string
	ready      bool
	cordoned   bool
	kernel     string
	boot       int
	readySince time.Time
	loaded     map[string]kmmv1beta1.ModuleConfig // what the kernel really has loaded
}

type simModule struct {
	exists  bool
	gen     int
	version string
	// broken is how the Module's config is broken: "" not at all, "worker" one only the worker
	// refuses (as after a version skew), "operator" one the operator's own check refuses.
	broken string
}

// brokenImageTag marks an image the model's worker refuses as an invalid config.
const brokenImageTag = "-broken"

// simNMC is one node's NMC. It is never changed in place (writeNMC makes a copy to change), so
// snapshots and clones of the world share it.
type simNMC struct {
	spec   map[string]kmmv1beta1.NodeModuleSpec
	status map[string]kmmv1beta1.NodeModuleStatus
	rv     int
}

type simPod struct {
	name    string
	uid     int
	node    string
	module  string
	action  contract.Action
	attempt int32
	entry   kmmv1beta1.NodeModuleSpec
	// previous is what a reload pod unloads first.
	previous *kmmv1beta1.ModuleConfig
	phase    WorkerPhase
	result   contract.Result
	created  time.Time
	hung     bool // never finishes by itself (a stalled registry, a wedged kubelet)
}

// simWorkload is the workload pod on a node that the versioned Module's drain selects.
type simWorkload struct {
	pdb         bool // a PodDisruptionBudget protects it: the Eviction API refuses to evict it
	finalizer   bool // it has a finalizer: deleted, it stays Terminating until the finalizer goes
	terminating bool
	// deviceUser: the podSelector does not select it, it requests the drain's extended resource.
	deviceUser bool
	job        bool // a Job controls it: the drain waits for it drainJobWait
}

// attemptRecord is what the back-off property remembers of a pair's last worker pod.
type attemptRecord struct {
	action contract.Action
	config kmmv1beta1.ModuleConfig
	failed time.Time // when that pod failed; zero while it runs or after it succeeded
	streak int32     // consecutive failures of this config
}

// snapshot is what a controller's cache held at some moment. Snapshots are never changed.
type snapshot struct {
	nmcs map[string]simNMC
	pods map[string]simPod
}

type world struct {
	cfg        *worldConfig
	faults     faults
	now        time.Time
	nodes      map[string]*simNode
	modules    map[string]*simModule
	nmcs       map[string]*simNMC
	pods       map[string]*simPod // worker pods by name
	dpPods     map[string]bool    // device plugin pods by node/module
	history    []*snapshot        // distinct cache contents, oldest first; the last is the current one
	conflict   bool               // the API server refuses the next NMC status write
	refuse     bool               // the API server refuses the next worker pod
	refuseNode bool               // the API server refuses the next cordon or uncordon
	nextUID    int
	violations []string
	attempts   map[string]*attemptRecord // by node/module
	refused    map[string]CreateRefusal  // refused pods by node/module, as the reconciler remembers them
	workloads  map[string]*simWorkload   // by node
	kmmCordon  map[string]string         // nodes whose cordon kmm made, with the pair's module
	// claims are the ResourceClaims allocated with devices of a Module's DRA driver, by node/module
	// (one stands for any number: the decision reads whether there are some).
	claims map[string]bool
	// unhooked are the pairs whose module the kernel has from a load whose postLoad hook has not
	// succeeded (failed, or skipped), by node/module.
	unhooked map[string]bool
	fired    []Edge // transitions made since the driver last looked
}

func newWorld(cfg *worldConfig, f faults) *world {
	w := &world{cfg: cfg, faults: f, now: t0, nodes: map[string]*simNode{}, modules: map[string]*simModule{},
		nmcs: map[string]*simNMC{}, pods: map[string]*simPod{}, dpPods: map[string]bool{}, attempts: map[string]*attemptRecord{},
		refused: map[string]CreateRefusal{}, workloads: map[string]*simWorkload{}, kmmCordon: map[string]string{}, claims: map[string]bool{},
		unhooked: map[string]bool{}}
	for i, n := range cfg.nodes {
		w.nodes[n] = &simNode{labels: map[string]string{"role": "worker"}, ready: true, kernel: kernelA, boot: 1,
			readySince: t0.Add(-time.Hour), loaded: map[string]kmmv1beta1.ModuleConfig{}}
		w.nmcs[n] = &simNMC{spec: map[string]kmmv1beta1.NodeModuleSpec{}, status: map[string]kmmv1beta1.NodeModuleStatus{}}
		if cfg.drain {
			// The first node's workload is protected by a PodDisruptionBudget and has a finalizer,
			// so that its drain runs every strategy; it is a Job's pod, waited for first, and uses
			// the Module's devices without the podSelector selecting it. The others are selected
			// and evicted at once.
			w.workloads[n] = &simWorkload{pdb: i == 0, finalizer: i == 0, deviceUser: i == 0, job: i == 0}
		}
	}
	for _, key := range cfg.modules {
		w.modules[key] = &simModule{exists: true, gen: 1}
	}
	if sm := w.modules[modVersion]; sm != nil {
		sm.version = "v1"
		ns, name := splitKey(modVersion)
		for _, sn := range w.nodes {
			sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = "v1"
		}
	}
	w.remember()
	return w
}

// has says whether the world has the Module.
func (w *world) has(key string) bool { return w.modules[key] != nil }

// clone returns a copy of the world that shares nothing it changes.
func (w *world) clone() *world {
	c := *w
	c.nodes = make(map[string]*simNode, len(w.nodes))
	for n, sn := range w.nodes {
		cp := *sn
		cp.labels, cp.loaded = maps.Clone(sn.labels), maps.Clone(sn.loaded)
		c.nodes[n] = &cp
	}
	c.modules = make(map[string]*simModule, len(w.modules))
	for k, sm := range w.modules {
		cp := *sm
		c.modules[k] = &cp
	}
	c.nmcs = make(map[string]*simNMC, len(w.nmcs))
	for n, nmc := range w.nmcs {
		c.nmcs[n] = nmc // never changed in place (writeNMC)
	}
	c.pods = make(map[string]*simPod, len(w.pods))
	for name, p := range w.pods {
		cp := *p
		c.pods[name] = &cp
	}
	c.dpPods = maps.Clone(w.dpPods)
	c.history = slices.Clone(w.history)
	c.violations = slices.Clone(w.violations)
	c.attempts = make(map[string]*attemptRecord, len(w.attempts))
	for k, r := range w.attempts {
		cp := *r
		c.attempts[k] = &cp
	}
	c.refused = maps.Clone(w.refused)
	c.workloads = make(map[string]*simWorkload, len(w.workloads))
	for n, wl := range w.workloads {
		cp := *wl
		c.workloads[n] = &cp
	}
	c.kmmCordon = maps.Clone(w.kmmCordon)
	c.claims = maps.Clone(w.claims)
	c.unhooked = maps.Clone(w.unhooked)
	c.fired = nil
	return &c
}

func (w *world) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

// remember records what the caches hold now, for controllers that act on a stale snapshot later.
// Only distinct contents are kept: a stale cache shows one of the last few that differed.
func (w *world) remember() {
	if n := len(w.history); n > 0 && w.cacheShows(w.history[n-1]) {
		return
	}
	s := &snapshot{nmcs: map[string]simNMC{}, pods: map[string]simPod{}}
	for n, nmc := range w.nmcs {
		s.nmcs[n] = *nmc // never changed in place (writeNMC)
	}
	for name, p := range w.pods {
		s.pods[name] = *p
	}
	w.history = append(w.history, s)
	if len(w.history) > w.cfg.history {
		w.history = w.history[len(w.history)-w.cfg.history:]
	}
}

// cacheShows says whether the snapshot holds what the API server holds now (NMCs by
// resourceVersion, worker pods by UID and phase).
func (w *world) cacheShows(s *snapshot) bool {
	for n, nmc := range w.nmcs {
		if s.nmcs[n].rv != nmc.rv {
			return false
		}
	}
	if len(s.pods) != len(w.pods) {
		return false
	}
	for name, p := range w.pods {
		if sp, ok := s.pods[name]; !ok || sp.uid != p.uid || sp.phase != p.phase {
			return false
		}
	}
	return true
}

// moduleObject is the Module API object for a simulated Module.
func (w *world) moduleObject(key string) *kmmv1beta1.Module {
	sm := w.modules[key]
	ns, name := splitKey(key)
	image := fmt.Sprintf("reg.example.com/%s:g%d-$KERNEL_FULL_VERSION", name, sm.gen)
	firmware := ""
	switch sm.broken {
	case "worker":
		image += brokenImageTag
	case "operator":
		firmware = "/"
	}
	m := &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"role": "worker"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Version:        sm.version,
				ContainerImage: image,
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: name, FirmwarePath: firmware},
				KernelMappings: []kmmv1beta1.KernelMapping{{Literal: kernelA}, {Regexp: `^6\.1\.0-57-`}},
			}},
			DevicePlugin: &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:1"}},
		},
	}
	switch {
	case !w.hasDevicePlugin(key):
		m.Spec.DevicePlugin = nil
	case w.hasDRA(key):
		m.Spec.DRA = &kmmv1beta1.DRASpec{Container: m.Spec.DevicePlugin.Container, DriverName: name + ".example.com"}
		m.Spec.DevicePlugin = nil
	}
	if key == modVersion && (w.cfg.drain || w.cfg.automatic) {
		up := &kmmv1beta1.UpgradePolicy{Automatic: w.cfg.automatic, Drain: w.drainPolicy()}
		if w.cfg.automatic {
			mu := intstr.FromInt32(int32(w.cfg.maxUnavailable))
			up.MaxUnavailable = &mu
		}
		m.Spec.UpgradePolicy = up
	}
	if w.hooked(key) {
		m.Spec.ModuleLoader.Hooks = &kmmv1beta1.ModuleHooks{
			PostLoad:  &kmmv1beta1.ModuleHook{Image: "reg.example.com/hooks:1", Args: []string{"post-load"}},
			PreUnload: &kmmv1beta1.ModuleHook{Image: "reg.example.com/hooks:1", Args: []string{"pre-unload"}},
		}
	}
	return m
}

// hooked says whether the Module has hooks.
func (w *world) hooked(key string) bool { return w.cfg.hooks && key == modVersion }

// hasDevicePlugin says whether the Module has a device plugin.
func (w *world) hasDevicePlugin(key string) bool {
	return key != modPlain || !w.cfg.plainWithoutDevicePlugin
}

// hasDRA says whether the Module runs a DRA driver (in place of its device plugin).
func (w *world) hasDRA(key string) bool {
	return w.cfg.dra && w.hasDevicePlugin(key)
}

// drainPolicy is the versioned Module's upgradePolicy.drain (nil without one).
func (w *world) drainPolicy() *kmmv1beta1.DrainSpec {
	if !w.cfg.drain {
		return nil
	}
	return &kmmv1beta1.DrainSpec{TimeoutSeconds: drainDeleteAfter, PDBForceDrainTimeoutSeconds: drainForceAfter,
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "workload"}},
		DeviceUsers: &kmmv1beta1.DrainDeviceUsers{ExtendedResources: []string{drainResource}},
		Jobs:        &kmmv1beta1.DrainJobs{WaitSeconds: drainJobWait}}
}

func splitKey(key string) (string, string) {
	ns, name, _ := strings.Cut(key, "/")
	return ns, name
}

func podName(node, module string) string { return "kmm-worker-" + node + "-" + module }

func (w *world) nodeView(n string) NodeView {
	sn := w.nodes[n]
	return NodeView{Name: n, Labels: sn.labels, KernelVersion: sn.kernel, Ready: sn.ready,
		Unschedulable: sn.cordoned, BootID: fmt.Sprint(sn.boot)}
}

// decideSpec is the Module→NMC decision for the Module key on the node v, or its seeded fault.
func (w *world) decideSpec(key string, v NodeView) SpecDecision {
	if w.faults.specReadsNodeStatus && !v.Ready {
		return SpecDecision{Action: SpecDelete, Reason: "NodeNotReady"}
	}
	return w.cachedDecideSpec(key, v)
}

// specDecisions remembers DecideSpec's answers by everything it is given (it is a pure function):
// the explorer asks the same questions in many states.
var specDecisions sync.Map

// specQuestion is everything DecideSpec is given: the simulated Module and the whole NodeView (the
// labels by two independent hashes of their set).
type specQuestion struct {
	key, version, broken, node, kernel, boot string
	gen, maxUnavailable                      int
	ready, unschedulable, drain, automatic   bool
	dra, hooks                               bool
	labels                                   [2]uint64
	faulty                                   bool // asked by a world with the seeded fault specReadsNodeStatus
}

var labelSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// specStatusBlind holds the questions for which invariant 1 was checked and held.
var specStatusBlind sync.Map

func (w *world) specQuestion(key string, v NodeView) specQuestion {
	sm := w.modules[key]
	q := specQuestion{key: key, version: sm.version, broken: sm.broken, node: v.Name, kernel: v.KernelVersion, boot: v.BootID,
		gen: sm.gen, ready: v.Ready, unschedulable: v.Unschedulable, drain: w.cfg.drain, automatic: w.cfg.automatic, maxUnavailable: w.cfg.maxUnavailable,
		dra: w.hasDRA(key), hooks: w.hooked(key)}
	for k, val := range v.Labels {
		for i, seed := range labelSeeds {
			q.labels[i] += maphash.String(seed, k)*0x9e3779b97f4a7c15 ^ maphash.String(seed, val)
		}
	}
	q.faulty = w.faults.specReadsNodeStatus
	return q
}

func (w *world) cachedDecideSpec(key string, v NodeView) SpecDecision {
	q := w.specQuestion(key, v)
	if d, ok := specDecisions.Load(q); ok {
		return d.(SpecDecision)
	}
	d := DecideSpec(w.moduleObject(key), v)
	specDecisions.Store(q, d)
	return d
}

// reconcileModule is the Module→NMC controller for one Module on every node. It writes only the
// NMC spec (invariant 2 is checked where it is enforced, by the API server's field managers: see
// the envtest suite of package controllers).
func (w *world) reconcileModule(key string) {
	for _, n := range w.cfg.nodes {
		d := SpecDecision{Action: SpecDelete}
		if w.modules[key].exists {
			d = w.decideSpec(key, w.nodeView(n))
		}
		w.writeSpec(n, key, d)
	}
}

// writeNMC replaces the node's NMC by a copy with a new resourceVersion and its own spec map, to
// change: NMCs are shared by the clones of a world and by the snapshots of its caches.
func (w *world) writeNMC(node string) *simNMC {
	old := w.nmcs[node]
	next := &simNMC{spec: maps.Clone(old.spec), status: old.status, rv: old.rv + 1}
	w.nmcs[node] = next
	return next
}

func (w *world) writeSpec(node, key string, d SpecDecision) {
	nmc := w.nmcs[node]
	switch d.Action {
	case SpecUpdate:
		if old, ok := nmc.spec[key]; !ok || !semantic.Equal(&old, d.Entry) {
			next := w.writeNMC(node)
			next.spec[key] = *d.Entry
			delete(w.attempts, node+"/"+key) // a new spec: the back-off property starts afresh
		}
	case SpecDelete:
		if _, ok := nmc.spec[key]; ok {
			delete(w.writeNMC(node).spec, key)
			delete(w.attempts, node+"/"+key)
		}
	}
}

// reconcileNMC is the NMC controller for one node, acting on the cache content age distinct
// contents back (0: the current one).
func (w *world) reconcileNMC(node string, age int) {
	snap := w.history[max(len(w.history)-1-age, 0)]
	nmc := snap.nmcs[node]
	keys := map[string]bool{}
	for k := range nmc.spec {
		keys[k] = true
	}
	for k := range nmc.status {
		keys[k] = true
	}
	for _, p := range snap.pods {
		if p.node == node {
			keys[p.module] = true
		}
	}
	newStatus := map[string]kmmv1beta1.NodeModuleStatus{}
	plans := map[string]Plan{}
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		f := w.facts(node, key, nmc, snap)
		r := Step(f)
		w.applyResultFaults(&r)
		if w.faults.readyIgnoresClaims && len(f.Claims) > 0 && r.Status != nil {
			f.Claims = nil
			r.Plan.Ready = Step(f).Plan.Ready
		}
		if undecidedUpstream(&r) {
			// NodeLabels leaves the labels of a record upstream KMM left as they are until Step
			// decided on it.
			ns, name := splitKey(key)
			labels := w.nodes[node].labels
			r.Plan.Ready, r.Plan.VersionReady = hasLabel(labels, kmmv1beta1.ReadyLabel(ns, name)), labels[kmmv1beta1.VersionReadyLabel(ns, name)]
		}
		for _, tr := range r.Fired {
			w.fired = append(w.fired, Edge{From: tr.From, Trigger: Trigger(tr.Trigger), To: tr.To})
		}
		if r.Err != nil {
			w.violate("unpermitted trigger for %s/%s: %v", node, key, r.Err)
		}
		if r.Status != nil {
			newStatus[key] = *r.Status
		}
		plans[key] = r.Plan
	}
	if !w.writeStatus(node, nmc.rv, nmc.status, newStatus, plans) {
		return
	}
	nodeRefused := false
	for _, key := range slices.Sorted(maps.Keys(plans)) {
		nodeRefused = w.execute(node, key, plans[key], snap) || nodeRefused
	}
	if age == 0 && !nodeRefused {
		w.checkCordonLifted(node, newStatus)
	}
}

// applyResultFaults breaks what the NMC decision returned, for the seeded faults that sit there.
func (w *world) applyResultFaults(r *Result) {
	if r.Status == nil {
		return
	}
	if w.faults.strandedRecordDropped && len(r.Fired) > 0 && r.Fired[0].From == Absent && Trigger(r.Fired[0].Trigger) == SpecRemoved {
		// What the decision did before the fix: nothing wanted, so the entry went, unloaded or not.
		*r = Result{}
		return
	}
	if c := r.Plan.CreateWorker; w.faults.reloadUnloadsNewConfig && c != nil && c.Action == contract.ActionReload {
		c.Previous = c.Entry.Config.DeepCopy()
	}
	if w.faults.hookSkipped && r.Plan.CreateWorker != nil {
		r.Plan.CreateWorker.Entry.Hooks = nil
	}
	if w.faults.logSkipsTransition && len(r.Fired) > 0 {
		r.Status.Transitions = r.Status.Transitions[:len(r.Status.Transitions)-1]
	}
	if w.faults.cordonForgotten && r.Status.Drain != nil && r.Status.Drain.CordonedByKMM {
		d := *r.Status.Drain
		d.CordonedByKMM = false
		r.Status.Drain = &d
	}
}

// checkCordonLifted is the drain property that every cordon kmm made is lifted once its pair is
// Loaded or gone: after a reconcile of the node on fresh data whose node patches went through, a
// cordon of kmm's may stay only for a pair that is still on its way.
func (w *world) checkCordonLifted(node string, status map[string]kmmv1beta1.NodeModuleStatus) {
	key, ok := w.kmmCordon[node]
	if !ok {
		return
	}
	if st, ok := status[key]; !ok || st.State == Loaded || st.State == Absent {
		w.violate("drain: kmm's cordon of %s stays after a reconcile though %s is %s", node, key, orGone(st.State))
	}
}

func orGone(s State) string {
	if s == "" {
		return "gone"
	}
	return string(s)
}

func (w *world) facts(node, key string, nmc simNMC, snap *snapshot) Facts {
	sn := w.nodes[node]
	ns, name := splitKey(key)
	f := Facts{Now: w.now, BackOff: DefaultBackOff, Status: kmmv1beta1.NodeModuleStatus{Namespace: ns, Name: name}}
	f.WorkerTimeout, f.BackOff = w.workerTimeout(), w.backOff()
	if e, ok := nmc.spec[key]; ok {
		f.Spec = &e
	}
	if st, ok := nmc.status[key]; ok {
		f.Status = st
	}
	f.Node = Node{Ready: sn.ready, Schedulable: !sn.cordoned, KernelVersion: sn.kernel, BootID: fmt.Sprint(sn.boot),
		ReadySince: sn.readySince}
	if w.modules[key].exists {
		f.Node.UpgradeTarget = sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)]
	}
	f.Node.WorkerPodVersion = sn.labels[kmmv1beta1.WorkerPodVersionLabel(ns, name)]
	if p := podOf(snap, node, key); p != nil {
		f.Worker = Worker{Phase: p.phase, Action: p.action, Attempt: p.attempt, Entry: p.entry, EntryKnown: true, Result: p.result, Created: p.created}
		if w.faults.failedEntryUnread && p.phase == PodFailed {
			f.Worker.Entry = kmmv1beta1.NodeModuleSpec{}
		}
	}
	f.SpecWrittenByKMM = f.Spec != nil // the model's spec entries are all kmm's; no upstream worker pods
	f.DevicePluginRunning = w.dpPods[node+"/"+key]
	f.DevicePluginConfigured = w.hasDevicePlugin(key)
	if w.hasDRA(key) && f.MayUnload() && w.claims[node+"/"+key] {
		// Read uncached, as the reconciler reads them, and only while the pair may unload.
		f.Claims = []string{"app/claim-" + node}
	}
	if r, ok := w.refused[node+"/"+key]; ok {
		f.CreateRefused = &r
	}
	w.applyNMCFaults(&f)
	w.drainFacts(node, key, &f)
	return f
}

// workerTimeout is the worker timeout the NMC controller uses, or its seeded fault.
func (w *world) workerTimeout() time.Duration {
	if w.faults.noWorkerTimeout {
		return 1000 * time.Hour
	}
	return DefaultWorkerTimeout
}

// backOff is the back-off the NMC controller uses, or its seeded fault.
func (w *world) backOff() BackOff {
	if w.faults.flatBackOff {
		return BackOff{Base: DefaultBackOff.Base, Max: DefaultBackOff.Base}
	}
	return DefaultBackOff
}

// podOf is the pair's worker pod in the snapshot: the newest when a seeded fault made several.
func podOf(snap *snapshot, node, key string) *simPod {
	var out *simPod
	for _, p := range snap.pods {
		if p.node == node && p.module == key && (out == nil || p.uid > out.uid) {
			cp := p
			out = &cp
		}
	}
	return out
}

// livePod is the pair's worker pod as it is now, nil when none.
func (w *world) livePod(node, key string) *simPod {
	var out *simPod
	for _, p := range w.pods {
		if p.node == node && p.module == key && (out == nil || p.uid > out.uid) {
			out = p
		}
	}
	return out
}

// drainFacts are the drain facts the reconciler gathers: the policy of a Module that exists, the
// node's cordon, and the workload pods, read only while the pair may drain.
func (w *world) drainFacts(node, key string, f *Facts) {
	if key != modVersion || !w.modules[key].exists {
		return
	}
	f.Drain = DrainFacts{Policy: w.drainPolicy(), NodeCordoned: w.nodes[node].cordoned}
	if f.Drain.Policy == nil || !f.MayDrain() {
		return
	}
	if wl := w.workloads[node]; wl != nil {
		p := WorkloadPod{Namespace: "app", Name: "workload-" + node, UID: "workload-" + node,
			PDBProtected: wl.pdb, Terminating: wl.terminating, Finalizers: wl.finalizer,
			OutsideSelector: wl.deviceUser, Job: wl.job && !w.faults.jobPodsUnseen}
		if wl.deviceUser && !w.faults.drainMissesDeviceUsers {
			p.Resources = []string{"cpu", drainResource}
		}
		f.Drain.Pods = []WorkloadPod{p}
	}
	f.Drain.Pods = append(f.Drain.Pods, w.kmmPodsOn(node, key)...)
}

// kmmPodsOn are kmm's own pods on the node as the drain of Module drained reads them (its
// podSelector is empty): the worker pods of every Module and the device plugin or DRA driver pods
// (a DaemonSet's), in name order. The drain must never touch one (executeDrain checks it), but the
// drained Module's own DRA driver pod, which it evicts last.
func (w *world) kmmPodsOn(node, drained string) []WorkloadPod {
	var out []WorkloadPod
	for _, p := range w.pods {
		if p.node == node && p.phase == PodRunning {
			ns, _ := splitKey(p.module)
			out = append(out, WorkloadPod{Namespace: ns, Name: p.name, UID: fmt.Sprint(p.uid), CreatedByKMM: !w.faults.drainSeesKMMPodsAsWork})
		}
	}
	for k, on := range w.dpPods {
		if n, key, _ := strings.Cut(k, "/"); on && n == node {
			ns, _ := splitKey(key)
			out = append(out, WorkloadPod{Namespace: ns, Name: w.pluginPodName(node, key), CreatedByKMM: true, DaemonSet: true,
				OwnDRADriver: key == drained && w.hasDRA(key)})
		}
	}
	slices.SortFunc(out, func(a, b WorkloadPod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// pluginPodName is the name of the Module's device plugin or DRA driver pod on the node.
func (w *world) pluginPodName(node, key string) string {
	_, name := splitKey(key)
	if w.hasDRA(key) {
		return name + "-dra-" + node
	}
	return name + "-device-plugin-" + node
}

func (w *world) applyNMCFaults(f *Facts) {
	if w.faults.nmcIgnoresReady {
		f.Node.Ready = true
	}
	if w.faults.unloadIgnoresDevicePlugin {
		f.DevicePluginRunning = false
	}
	if w.faults.unloadIgnoresClaims {
		f.Claims = nil
	}
	if w.faults.reloadIgnoresDevicePlugin && f.DevicePluginRunning {
		// Blind to the device plugin pod only where that blindness makes a reload.
		g := *f
		g.DevicePluginRunning = false
		f.DevicePluginRunning = !g.reloadable()
	}
	if w.faults.ignoresReboots {
		f.Node.BootID = f.Status.BootID
		f.Node.ReadySince = time.Time{}
	}
}

// writeStatus writes the NMC status with optimistic concurrency. The reconcile acts on the world (a
// pod, a label, a cordon, a drain) only after a successful write (a no-op write still checks the
// resourceVersion), so a stale snapshot never acts.
func (w *world) writeStatus(node string, rv int, old, next map[string]kmmv1beta1.NodeModuleStatus, plans map[string]Plan) bool {
	acts := false
	for key, p := range plans {
		acts = acts || p.CreateWorker != nil
		if !w.faults.onlyCreatesCheckFreshness {
			acts = acts || p.Drain != nil || p.Uncordon || w.relabels(node, key, p)
		}
	}
	changed := !semantic.Equal(&old, &next)
	if !changed && !acts {
		return true
	}
	nmc := w.nmcs[node]
	if w.conflict || nmc.rv != rv {
		w.conflict = false
		return false
	}
	if changed {
		w.writeNMC(node).status = next
	}
	return true
}

// relabels says whether the plan changes the node's ready or version.ready label of the pair.
func (w *world) relabels(node, key string, p Plan) bool {
	labels := w.nodes[node].labels
	ns, name := splitKey(key)
	_, ready := labels[kmmv1beta1.ReadyLabel(ns, name)]
	v, versioned := labels[kmmv1beta1.VersionReadyLabel(ns, name)]
	return ready != p.Ready || versioned != (p.VersionReady != "") || v != p.VersionReady
}

// execute carries out a pair's plan: node labels, the drain, finished-pod deletion, pod creation.
// It says whether the API server refused a cordon or an uncordon.
func (w *world) execute(node, key string, p Plan, snap *snapshot) bool {
	sn := w.nodes[node]
	ns, name := splitKey(key)
	_, inKernel := sn.loaded[key]
	if hasLabel(sn.labels, kmmv1beta1.ReadyLabel(ns, name)) && !p.Ready && w.hasDRA(key) && w.claims[node+"/"+key] && inKernel {
		w.violate("claims: the ready label of %s on %s, which keeps its DRA driver there, goes while the module is loaded and a ResourceClaim of its devices is allocated", key, node)
	}
	setLabel(sn.labels, kmmv1beta1.ReadyLabel(ns, name), "", p.Ready)
	setLabel(sn.labels, kmmv1beta1.VersionReadyLabel(ns, name), p.VersionReady, p.VersionReady != "")
	nodeRefused := w.executeDrain(node, key, p)
	if p.DeleteWorker {
		if seen := podOf(snap, node, key); seen != nil {
			if cur, ok := w.pods[seen.name]; ok && cur.uid == seen.uid {
				if seen.phase == PodRunning && cur.phase != PodRunning {
					return nodeRefused // the overdue pod finished since: the resourceVersion precondition fails
				}
				if cur.phase == PodRunning {
					w.killPod(cur) // an overdue pod: the kubelet stops it before its worker acted
				}
				delete(w.pods, seen.name) // delete with a UID precondition
			}
		}
	}
	if p.CreateWorker != nil {
		pn := podName(node, name)
		if w.faults.podGenerateName {
			pn += fmt.Sprintf("-%d", w.nextUID+1)
		}
		w.createPod(node, key, pn, p.CreateWorker)
	}
	return nodeRefused
}

// executeDrain carries out a pair's drain plan as the API server and the kubelet answer it: a
// PodDisruptionBudget refuses the eviction of the pod it protects, a deleted pod with a finalizer
// stays Terminating until the finalizer is stripped. It says whether a node patch was refused.
func (w *world) executeDrain(node, key string, p Plan) bool {
	if p.Uncordon {
		return !w.patchCordon(node, key, false)
	}
	d := p.Drain
	if d == nil {
		return false
	}
	refused := d.Cordon && !w.patchCordon(node, key, true)
	for _, p := range slices.Concat(d.Evict, d.Delete, d.StripFinalizers) {
		switch {
		case p.Name == "workload-"+node:
			w.checkJobWait(node, key)
		case p.Name == w.pluginPodName(node, key) && w.hasDRA(key):
			if w.claims[node+"/"+key] {
				w.violate("claims: the drain of %s on %s evicts its DRA driver while a ResourceClaim of its devices is allocated there", key, node)
			}
			delete(w.dpPods, node+"/"+key) // the DaemonSet controller puts it back while its labels select the node
		default:
			w.violate("drain: the drain of %s on %s touches %s/%s, a pod kmm created", key, node, p.Namespace, p.Name)
		}
	}
	wl := w.workloads[node]
	if wl == nil {
		return refused
	}
	switch {
	case len(d.StripFinalizers) > 0 && wl.terminating:
		delete(w.workloads, node)
	case len(d.Delete) > 0 && wl.finalizer:
		wl.terminating = true
	case len(d.Delete) > 0, len(d.Evict) > 0 && !wl.pdb:
		delete(w.workloads, node)
	}
	return refused
}

// checkJobWait is the Job wait's property: the drain touches a Job's pod only once jobs.waitSeconds
// passed since the drain started (as the pair's status, just written, records it).
func (w *world) checkJobWait(node, key string) {
	wl, st := w.workloads[node], w.nmcs[node].status[key]
	if wl != nil && wl.job && st.Drain != nil && w.now.Before(st.Drain.StartTime.Add(drainJobWait*time.Second)) {
		w.violate("drain: the drain of %s on %s touches the Job pod workload-%s %s after it started, before jobs.waitSeconds (%ds)",
			key, node, node, w.now.Sub(st.Drain.StartTime.Time), drainJobWait)
	}
}

// patchCordon sets the node's spec.unschedulable for kmm, unless the API server refuses it.
func (w *world) patchCordon(node, key string, cordon bool) bool {
	sn := w.nodes[node]
	if sn.cordoned == cordon {
		return true
	}
	if w.refuseNode {
		w.refuseNode = false
		return false
	}
	sn.cordoned = cordon
	if cordon {
		w.kmmCordon[node] = key
	} else {
		delete(w.kmmCordon, node)
	}
	return true
}

func setLabel(labels map[string]string, key, value string, present bool) {
	if present {
		labels[key] = value
	} else {
		delete(labels, key)
	}
}

// createPod creates a worker pod, checking invariants 4 and 6 against the real world.
func (w *world) createPod(node, key, name string, in *WorkerIntent) {
	if _, exists := w.pods[name]; exists {
		return // AlreadyExists
	}
	sn := w.nodes[node]
	if !sn.ready {
		w.violate("invariant 4: %s pod for %s created on NotReady node %s", in.Action, key, node)
	}
	if in.Entry.Config.KernelVersion != sn.kernel {
		w.violate("invariant 4: %s pod for %s on %s is for kernel %s, node runs %s", in.Action, key, node, in.Entry.Config.KernelVersion, sn.kernel)
	}
	if in.Action != contract.ActionLoad && w.dpPods[node+"/"+key] {
		w.violate("invariant 6: %s pod for %s created on %s while its device plugin pod runs", in.Action, key, node)
	}
	if wl := w.workloads[node]; in.Action != contract.ActionLoad && key == modVersion && wl != nil && wl.deviceUser && w.modules[key].exists {
		w.violate("drain: %s pod for %s created on %s while a pod using its devices (%s) runs there", in.Action, key, node, drainResource)
	}
	if in.Action != contract.ActionLoad && w.claims[node+"/"+key] {
		w.violate("claims: %s pod for %s created on %s while a ResourceClaim of its DRA driver is allocated there", in.Action, key, node)
	}
	w.checkReloadIntent(node, key, in)
	w.checkHookIntent(node, key, in)
	if cur, ok := sn.loaded[key]; ok && in.Action == contract.ActionLoad && !equality.Semantic.DeepEqual(cur, in.Entry.Config) {
		w.violate("invariant 6: load of %s (%s) on %s while %s is still loaded", key, in.Entry.Config.ContainerImage, node, cur.ContainerImage)
	}
	if w.refuse {
		w.refuse = false
		w.refused[node+"/"+key] = CreateRefusal{Action: in.Action, Attempt: in.Attempt, Message: "refused"}
		return
	}
	delete(w.refused, node+"/"+key)
	w.checkBackOff(node, key, in)
	w.nextUID++
	w.pods[name] = &simPod{name: name, uid: w.nextUID, node: node, module: key, action: in.Action, attempt: in.Attempt,
		entry: *in.Entry.DeepCopy(), previous: in.Previous.DeepCopy(), phase: PodRunning, created: w.now}
}

// checkHookIntent is the preUnload hook's property: an unload pod of a pair whose Module has hooks
// (its NMC spec entry, or the record of the loaded config, names them) runs the preUnload hook
// first. (A record upstream KMM left names none: kmm never saw a hook for it.)
func (w *world) checkHookIntent(node, key string, in *WorkerIntent) {
	nmc := w.nmcs[node]
	known := nmc.spec[key].Hooks != nil || nmc.status[key].Hooks != nil
	if in.Action == contract.ActionUnload && known && (in.Entry.Hooks == nil || in.Entry.Hooks.PreUnload == nil) {
		w.violate("hooks: an unload pod of %s on %s without its preUnload hook", key, node)
	}
	if in.Action == contract.ActionLoad && nmc.spec[key].Hooks != nil && (in.Entry.Hooks == nil || in.Entry.Hooks.PostLoad == nil) {
		w.violate("hooks: a load pod of %s on %s without its postLoad hook", key, node)
	}
}

// checkReloadIntent checks a reload pod against the real world: it unloads what the kernel has
// loaded (the config recorded as loaded, not the new one), and it loads a config for the same
// kernel; a versioned Module never reloads (its upgrade is seed 002's flow).
func (w *world) checkReloadIntent(node, key string, in *WorkerIntent) {
	if in.Action != contract.ActionReload {
		return
	}
	if in.Previous == nil {
		w.violate("invariant 6: reload pod for %s on %s names no config to unload", key, node)
		return
	}
	if cur, ok := w.nodes[node].loaded[key]; ok && !equality.Semantic.DeepEqual(cur, *in.Previous) {
		w.violate("invariant 6: reload pod for %s on %s unloads %s while %s is loaded", key, node, in.Previous.ContainerImage, cur.ContainerImage)
	}
	if in.Previous.Version != "" || in.Entry.Config.Version != "" {
		w.violate("invariant 6: reload pod for the versioned %s on %s (versions %q → %q): an upgrade must unload, then load", key, node, in.Previous.Version, in.Entry.Config.Version)
	}
}

// checkBackOff is the back-off property: after n consecutive failures of the same action and
// config on a pair, the next pod for it starts no sooner than the back-off after n failures allows,
// counted from when the last one failed (the operator sees it later, never sooner). A change of the
// spec entry, a success or a reboot starts afresh: those are events, not retries.
func (w *world) checkBackOff(node, key string, in *WorkerIntent) {
	pair := node + "/" + key
	rec := w.attempts[pair]
	if rec != nil && !rec.failed.IsZero() && rec.action == in.Action && equality.Semantic.DeepEqual(rec.config, in.Entry.Config) {
		if due := rec.failed.Add(DefaultBackOff.Delay(rec.streak)); w.now.Before(due) {
			w.violate("back-off: %s pod %d for %s on %s created %v after failure %d of the same config, the back-off allows %v",
				in.Action, rec.streak+1, key, node, w.now.Sub(rec.failed), rec.streak, DefaultBackOff.Delay(rec.streak))
		}
	} else {
		rec = &attemptRecord{action: in.Action, config: *in.Entry.Config.DeepCopy()}
		w.attempts[pair] = rec
	}
	rec.failed = time.Time{}
}

// recordAttempt remembers how a worker pod ended for the back-off property.
func (w *world) recordAttempt(p *simPod) {
	rec := w.attempts[p.node+"/"+p.module]
	if rec == nil {
		return
	}
	if p.phase == PodFailed {
		rec.failed, rec.streak = w.now, rec.streak+1
		return
	}
	delete(w.attempts, p.node+"/"+p.module)
}

// killPod ends a running pod without its worker acting (deleted or evicted).
func (w *world) killPod(p *simPod) {
	p.phase, p.result = PodFailed, contract.Result{Reason: "Other", Message: "killed"}
	w.recordAttempt(p)
}

// finishPod plays the kubelet and the worker for a running pod.
func (w *world) finishPod(p *simPod, succeed bool) {
	sn := w.nodes[p.node]
	if p.entry.Config.KernelVersion != sn.kernel {
		succeed = false // modprobe refuses a module built for another kernel
	}
	if p.action != contract.ActionLoad && w.dpPods[p.node+"/"+p.module] {
		w.violate("invariant 6: %s of %s on %s ran while its device plugin pod runs", p.action, p.module, p.node)
	}
	p.result = contract.Result{BootID: fmt.Sprint(sn.boot), ImageDigest: "sha256:" + p.entry.Config.ContainerImage}
	defer w.recordAttempt(p)
	if p.action == contract.ActionReload {
		w.finishReload(p, sn, succeed)
		return
	}
	if p.action == contract.ActionLoad && strings.Contains(p.entry.Config.ContainerImage, brokenImageTag) {
		p.phase, p.result.Reason, p.result.Message = PodFailed, contract.ReasonInvalidConfig, "invalid config"
		return
	}
	if !succeed {
		p.phase, p.result.Reason, p.result.Message = PodFailed, "Other", "injected failure"
		return
	}
	p.phase = PodSucceeded
	pair := p.node + "/" + p.module
	if p.action == contract.ActionLoad {
		sn.loaded[p.module] = p.entry.Config
		w.unhooked[pair] = w.hooked(p.module) && (p.entry.Hooks == nil || p.entry.Hooks.PostLoad == nil)
	} else {
		delete(sn.loaded, p.module)
		delete(w.unhooked, pair)
	}
}

// failHook plays a hook that fails in a running pod of a Module with hooks: a postLoad hook after
// its worker loaded the module, or a preUnload hook, before the unload could run.
func (w *world) failHook(p *simPod) {
	sn := w.nodes[p.node]
	if p.entry.Hooks == nil || p.entry.Config.KernelVersion != sn.kernel {
		return
	}
	p.result = contract.Result{Outcome: contract.OutcomeFailed, BootID: fmt.Sprint(sn.boot), ImageDigest: "sha256:" + p.entry.Config.ContainerImage,
		Message: "injected hook failure"}
	switch {
	case p.action == contract.ActionLoad && p.entry.Hooks.PostLoad != nil && !strings.Contains(p.entry.Config.ContainerImage, brokenImageTag):
		sn.loaded[p.module] = p.entry.Config
		w.unhooked[p.node+"/"+p.module] = true
		p.result.Reason = ReasonPostLoadHookFailed
	case p.action == contract.ActionUnload && p.entry.Hooks.PreUnload != nil:
		p.result.Reason = ReasonPreUnloadHookFailed // the module stays loaded
	default:
		return
	}
	p.phase = PodFailed
	w.recordAttempt(p)
}

// finishReload plays a reload worker: the new config is checked and both images pulled first (a
// broken image fails before anything changes), then the unload half (a failure there, Busy, leaves
// the old config loaded), then the load half.
func (w *world) finishReload(p *simPod, sn *simNode, succeed bool) {
	switch {
	case strings.Contains(p.entry.Config.ContainerImage, brokenImageTag):
		p.phase, p.result.Reason, p.result.Message, p.result.FailedStep = PodFailed, contract.ReasonInvalidConfig, "invalid config", "unload"
	case !succeed:
		p.phase, p.result.Reason, p.result.Message, p.result.FailedStep = PodFailed, "Busy", "injected failure: module in use", "unload"
	default:
		p.phase = PodSucceeded
		sn.loaded[p.module] = p.entry.Config
	}
}

// failReloadLoadHalf plays a reload whose unload half succeeds and whose load half fails.
func (w *world) failReloadLoadHalf(p *simPod) {
	sn := w.nodes[p.node]
	p.result = contract.Result{BootID: fmt.Sprint(sn.boot), ImageDigest: "sha256:" + p.entry.Config.ContainerImage,
		Reason: "NotFound", Message: "injected failure: module not found", FailedStep: contract.StepLoad}
	p.phase = PodFailed
	delete(sn.loaded, p.module)
	w.recordAttempt(p)
}

// reconcileLabels is the version label controller of package upgrade for the versioned Module.
func (w *world) reconcileLabels(node string) {
	if !w.has(modVersion) {
		return
	}
	sn := w.nodes[node]
	ns, name := splitKey(modVersion)
	st := w.nmcs[node].status[modVersion]
	loadedVersion := ""
	if st.Config != nil {
		loadedVersion = st.Config.Version
	}
	in := upgrade.NodeLabels{Target: sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)], WorkerPod: sn.labels[kmmv1beta1.WorkerPodVersionLabel(ns, name)],
		DevicePlugin: sn.labels[kmmv1beta1.DevicePluginVersionLabel(ns, name)]}
	out := upgrade.NextLabels(in, upgrade.Observed{DevicePluginPodOnNode: w.dpPods[node+"/"+modVersion], LoadedVersion: loadedVersion, Loaded: st.State == Loaded,
		DRA: w.hasDRA(modVersion)})
	setLabel(sn.labels, kmmv1beta1.WorkerPodVersionLabel(ns, name), out.WorkerPod, out.WorkerPod != "")
	setLabel(sn.labels, kmmv1beta1.DevicePluginVersionLabel(ns, name), out.DevicePlugin, out.DevicePlugin != "")
}

// reconcileRollout is the automatic rollout: the real planner (upgrade.PlanRollout) on what the
// world shows, so that the drains of several nodes overlap exactly as the operator makes them. The
// rollout faults change what the planner sees, to play the rules it must not follow.
func (w *world) reconcileRollout() {
	sm := w.modules[modVersion]
	if !w.cfg.automatic || sm == nil || !sm.exists {
		return
	}
	ns, name := splitKey(modVersion)
	key := kmmv1beta1.ModuleVersionLabel(ns, name)
	in := upgrade.RolloutInput{Module: w.moduleObject(modVersion)}
	for _, n := range w.cfg.nodes {
		sn, st := w.nodes[n], w.nmcs[n].status[modVersion]
		rn := upgrade.RolloutNode{Name: n, Labels: sn.labels, Ready: sn.ready, Unschedulable: sn.cordoned, State: st.State}
		if st.Config != nil {
			rn.LoadedVersion = st.Config.Version
		}
		rn.CordonedByKMM = st.Drain != nil && st.Drain.CordonedByKMM
		in.Nodes = append(in.Nodes, w.faults.rolloutView(rn, key, sm.version))
	}
	intents, _ := upgrade.PlanRollout(in)
	for _, it := range intents {
		w.nodes[it.Node].labels[key] = it.Version
	}
}

// rolloutView is what a faulty rollout sees of a node: a node it must count or retarget, shown
// as one it may ignore.
func (f faults) rolloutView(n upgrade.RolloutNode, key, version string) upgrade.RolloutNode {
	label, labelled := n.Labels[key]
	runsLabel := n.State == Loaded && n.LoadedVersion == label
	switch {
	case f.rolloutIgnoresInProgress && labelled && label == version && !runsLabel,
		f.rolloutDoneIgnoresCordon && labelled && label == version && runsLabel:
		n.State, n.LoadedVersion, n.Ready, n.Unschedulable = Loaded, version, true, false
	case f.rolloutNeverRetargets && labelled && label != version:
		n.State, n.LoadedVersion, n.CordonedByKMM = Loaded, label, false
	}
	return n
}

// reconcileDaemonSets plays the DaemonSet controller: a device plugin pod runs where the node has
// the ready label (and, for a versioned Module, a version-device-plugin label).
func (w *world) reconcileDaemonSets(node string) {
	sn := w.nodes[node]
	for _, key := range w.cfg.modules {
		ns, name := splitKey(key)
		// A DRA driver's DaemonSets stay while its Module is being deleted (until the finalizer
		// lets it go); a device plugin's go at once.
		kept := w.modules[key].exists || (w.hasDRA(key) && !w.faults.draDriverGoesWithModule && !w.released(key))
		selected := w.hasDevicePlugin(key) && hasLabel(sn.labels, kmmv1beta1.ReadyLabel(ns, name))
		if key == modVersion {
			selected = selected && sn.labels[kmmv1beta1.DevicePluginVersionLabel(ns, name)] != ""
		}
		if kept && selected {
			w.dpPods[node+"/"+key] = true
			continue
		}
		if selected && w.dpPods[node+"/"+key] && w.claims[node+"/"+key] {
			w.violate("claims: the DRA driver of %s leaves %s with its DaemonSet while a ResourceClaim of its devices is allocated there", key, node)
		}
		delete(w.dpPods, node+"/"+key)
	}
}

func hasLabel(labels map[string]string, key string) bool {
	_, ok := labels[key]
	return ok
}

// catchUp runs every controller once on every node, as happens when events settle.
func (w *world) catchUp() {
	for _, key := range w.cfg.modules {
		w.reconcileModule(key)
	}
	w.reconcileRollout()
	for _, n := range w.cfg.nodes {
		w.reconcileLabels(n)
		w.remember()
		w.reconcileNMC(n, 0)
		w.reconcileDaemonSets(n)
	}
}

func (w *world) reboot(node string) {
	sn := w.nodes[node]
	sn.boot++
	sn.readySince = w.now
	clear(sn.loaded)
	for _, key := range w.cfg.modules {
		delete(w.unhooked, node+"/"+key)
	}
	for _, p := range w.pods {
		if p.node == node && p.phase == PodRunning {
			p.phase, p.result = PodFailed, contract.Result{Reason: "Other", Message: "node rebooted"}
		}
	}
	for pair := range w.attempts {
		if strings.HasPrefix(pair, node+"/") {
			delete(w.attempts, pair) // a reboot starts afresh
		}
	}
	for _, key := range w.cfg.modules {
		delete(w.dpPods, node+"/"+key)
	}
}

// check verifies the invariants that hold at every step.
func (w *world) check() {
	w.checkSpecIgnoresNodeStatus()
	perPair := map[string]int{}
	for _, p := range w.pods {
		perPair[p.node+"/"+p.module]++
		if p.action != contract.ActionLoad && p.phase == PodRunning && w.dpPods[p.node+"/"+p.module] {
			w.violate("invariant 6: %s pod of %s running on %s next to its device plugin pod", p.action, p.module, p.node)
		}
		if p.action != contract.ActionLoad && p.phase == PodRunning && w.claims[p.node+"/"+p.module] {
			w.violate("claims: %s pod of %s running on %s while a ResourceClaim of its DRA driver is allocated there", p.action, p.module, p.node)
		}
	}
	for _, pair := range slices.Sorted(maps.Keys(perPair)) {
		if n := perPair[pair]; n > 1 {
			w.violate("invariant 3: %d worker pods for %s", n, pair)
		}
	}
	for _, node := range w.cfg.nodes {
		for _, key := range slices.Sorted(maps.Keys(w.nmcs[node].status)) {
			w.checkRecord(node, key, w.nmcs[node].status[key])
		}
	}
	w.checkHooks()
	if w.cfg.automatic && len(w.kmmCordon) > w.cfg.maxUnavailable {
		w.violate("drain: %d nodes cordoned by kmm (%v), maxUnavailable is %d", len(w.kmmCordon), slices.Sorted(maps.Keys(w.kmmCordon)), w.cfg.maxUnavailable)
	}
}

// checkHooks is the postLoad hook's property: a pair is Loaded (its ready label goes on, its device
// plugin may start, a rollout counts it) only when its postLoad hook succeeded since the kernel
// loaded the module. (The ready label itself may stay for allocated ResourceClaims of its DRA
// driver, claimsKeepDriver, and lags a step behind the record: the record is what is checked.)
func (w *world) checkHooks() {
	for _, n := range w.cfg.nodes {
		for _, key := range w.cfg.modules {
			if st, ok := w.nmcs[n].status[key]; ok && st.State == Loaded && w.unhooked[n+"/"+key] {
				w.violate("hooks: %s on %s is Loaded, its postLoad hook has not succeeded since the load", key, n)
			}
		}
	}
}

// checkSpecIgnoresNodeStatus is invariant 1: changing node status alone changes no decision.
func (w *world) checkSpecIgnoresNodeStatus() {
	for _, key := range w.cfg.modules {
		if !w.modules[key].exists {
			continue
		}
		for _, n := range w.cfg.nodes {
			v := w.nodeView(n)
			q := w.specQuestion(key, v)
			if _, ok := specStatusBlind.Load(q); ok {
				continue // asked and answered before
			}
			flipped := v
			flipped.Ready, flipped.Unschedulable, flipped.BootID = !v.Ready, !v.Unschedulable, v.BootID+"x"
			if a, b := w.decideSpec(key, v), w.decideSpec(key, flipped); reflect.DeepEqual(a, b) {
				specStatusBlind.Store(q, true)
			} else {
				w.violate("invariant 1: Module→NMC decision for %s on %s changed with node status: %v vs %v", key, n, a.Action, b.Action)
			}
		}
	}
}

// checkRecord verifies invariant 8 (the log replays to the state) and the version.ready label.
func (w *world) checkRecord(node, key string, st kmmv1beta1.NodeModuleStatus) {
	if got, err := replay(st.Transitions); err != nil || (len(st.Transitions) > 0 && got != st.State) {
		w.violate("invariant 8: log of %s/%s replays to %s (%v), state is %s", node, key, got, err, st.State)
	}
	ns, name := splitKey(key)
	sn := w.nodes[node]
	if v, ok := sn.labels[kmmv1beta1.VersionReadyLabel(ns, name)]; ok {
		if cur, loaded := sn.loaded[key]; loaded && cur.Version != v {
			w.violate("invariant 6: version.ready of %s on %s says %s, %s is loaded", key, node, v, cur.Version)
		}
	}
}

// stopEvents ends the events: the API server accepts everything, nodes are Ready, the user's
// cordons are lifted (kmm's are kmm's to lift), and the version-module labels the user set ask for
// the Module's version, and the ResourceClaims are released (a claim that stays holds its pair for
// good, by design: convergence is asked of a world whose workloads end).
func (w *world) stopEvents() {
	w.conflict, w.refuse, w.refuseNode = false, false, false
	clear(w.claims) // the workloads using them end; the resource claim controller deallocates them
	ns, name := splitKey(modVersion)
	for n, sn := range w.nodes {
		if !sn.ready {
			sn.ready, sn.readySince = true, w.now
		}
		if _, kmms := w.kmmCordon[n]; !kmms {
			sn.cordoned = false
		}
		if _, ok := sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)]; ok && !w.cfg.automatic && w.has(modVersion) && w.modules[modVersion].exists {
			sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = w.modules[modVersion].version
		}
	}
}

// settleRound lets ten minutes pass, the running pods that can finish succeed, and every
// controller run once; it says whether anything changed.
func (w *world) settleRound() bool {
	before := w.fingerprint()
	w.now = w.now.Add(10 * time.Minute)
	for _, name := range slices.Sorted(maps.Keys(w.pods)) {
		if p := w.pods[name]; p.phase == PodRunning && !p.hung {
			w.finishPod(p, true)
		}
	}
	for _, key := range w.cfg.modules {
		w.reconcileModule(key)
	}
	w.reconcileRollout()
	for _, n := range w.cfg.nodes {
		w.reconcileLabels(n)
		w.reconcileDaemonSets(n)
		w.remember()
		w.reconcileNMC(n, 0)
	}
	return w.fingerprint() != before
}

// maxSettleRounds bounds how many rounds of reconciles convergence may take (invariant 7).
const maxSettleRounds = 30

// settle stops the events and runs every controller until nothing changes; it returns false if
// that takes more than maxRounds.
func (w *world) settle(maxRounds int) bool {
	w.stopEvents()
	for range maxRounds {
		if !w.settleRound() {
			return true
		}
	}
	return false
}

// describe prints the pairs and pods, for a failure message.
func (w *world) describe() string {
	s := ""
	for _, n := range w.cfg.nodes {
		for _, key := range slices.Sorted(maps.Keys(w.nmcs[n].status)) {
			st := w.nmcs[n].status[key]
			s += fmt.Sprintf("\n%s %s: %s/%s attempts %d: %s", n, key, st.State, st.Reason, st.Attempts, st.Message)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(w.pods)) {
		p := w.pods[name]
		s += fmt.Sprintf("\npod %s %s attempt %d %s %s", name, p.action, p.attempt, p.phase, p.entry.Config.ContainerImage)
	}
	return s
}

// checkConverged is invariants 5 and 7 and the drain's end: every pair is Loaded with its spec
// config (and the kernel really has it) or Absent with nothing loaded, and kmm's cordons are lifted.
func (w *world) checkConverged() {
	for _, n := range slices.Sorted(maps.Keys(w.kmmCordon)) {
		w.violate("drain: kmm's cordon of %s (for %s) is still there after every pair settled", n, w.kmmCordon[n])
	}
	for _, n := range w.cfg.nodes {
		sn, nmc := w.nodes[n], w.nmcs[n]
		for _, key := range w.cfg.modules {
			spec, hasSpec := nmc.spec[key]
			st := nmc.status[key]
			cur, loaded := sn.loaded[key]
			pod := w.livePod(n, key)
			if hasSpec && spec.Config.KernelVersion == sn.kernel && w.modules[key].broken != "" {
				// A config no worker can act on: failed for good, nothing loaded, no pod, until it changes.
				if st.State != LoadBackOff || st.Reason != ReasonInvalidConfig || loaded || pod != nil && pod.phase == PodRunning {
					w.violate("invariant 7: %s on %s has a config no worker accepts: %s/%s (loaded in kernel: %v), want LoadBackOff InvalidConfig; log %v",
						key, n, st.State, st.Reason, loaded, st.Transitions)
				}
				continue
			}
			if hasSpec && spec.Config.KernelVersion == sn.kernel {
				if st.State != Loaded || st.Config == nil || !equality.Semantic.DeepEqual(*st.Config, spec.Config) || !loaded ||
					!equality.Semantic.DeepEqual(cur, spec.Config) {
					w.violate("invariant 7/5: %s on %s is %s (loaded in kernel: %v), want Loaded with %s; pod %+v; log %v",
						key, n, st.State, loaded, spec.Config.ContainerImage, pod, st.Transitions)
				}
				continue
			}
			if (st.State != "" && st.State != Absent) || loaded {
				w.violate("invariant 7: %s on %s is %s (loaded in kernel: %v), want Absent", key, n, st.State, loaded)
			}
		}
	}
}
