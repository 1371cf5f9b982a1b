package fsm

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/upgrade"
)

// This file is a model of the cluster: nodes with a kernel that really has modules loaded or not,
// Modules, NMCs, worker pods, device plugin pods and the controllers, driven by the real decision
// code (DecideSpec, Step, upgrade.NextLabels) and the real state machine. rapid drives it through
// random interleavings of events and checks the invariants of SPEC §4 after every step.

const (
	kernelA     = "6.1.0-56-cloud-amd64"
	kernelB     = "6.1.0-57-cloud-amd64"
	kernelNoMap = "4.18.0-1.el8.x86_64" // no kernel mapping matches it
	modPlain    = "ns/plain"            // no version; has a device plugin
	modVersion  = "ns/versioned"        // ordered upgrades; has a device plugin
	writerSpec  = "module-nmc"
	writerNMC   = "nmc"
)

var (
	modelNodes   = []string{"n0", "n1", "n2"}
	modelModules = []string{modPlain, modVersion}
	modelKernels = []string{kernelA, kernelB, kernelNoMap}
)

// visitedEdges counts the transitions the model made, so that the property test can show (and
// require) that its interleavings reach every state.
var visitedEdges = map[Edge]int{}

// faults are deliberately broken variants of the controllers; the seeded-fault tests check that
// the property test catches each one.
type faults struct {
	nmcIgnoresReady           bool // the NMC decision treats every node as Ready
	specReadsNodeStatus       bool // the Module→NMC decision drops entries of NotReady nodes
	unloadIgnoresDevicePlugin bool // the NMC decision never sees the device plugin pod
	ignoresReboots            bool // the NMC decision never sees a new boot ID or Ready time
	failedEntryUnread         bool // a failed pod's config reads as empty yet known (the retry storm of issue 13)
	noWorkerTimeout           bool // worker pods never time out
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

type simNMC struct {
	spec   map[string]kmmv1beta1.NodeModuleSpec
	status map[string]kmmv1beta1.NodeModuleStatus
	rv     int
}

type simPod struct {
	uid     int
	node    string
	module  string
	action  WorkerAction
	attempt int32
	entry   kmmv1beta1.NodeModuleSpec
	phase   WorkerPhase
	result  WorkerResult
	created time.Time
	hung    bool // never finishes by itself (a stalled registry, a wedged kubelet)
}

// attemptRecord is what the back-off property remembers of a pair's last worker pod.
type attemptRecord struct {
	action WorkerAction
	config kmmv1beta1.ModuleConfig
	failed time.Time // when that pod failed; zero while it runs or after it succeeded
	streak int32     // consecutive failures of this config
}

// snapshot is what a controller's cache held at some moment.
type snapshot struct {
	nmcs map[string]simNMC
	pods map[string]simPod
}

type world struct {
	faults     faults
	now        time.Time
	nodes      map[string]*simNode
	modules    map[string]*simModule
	nmcs       map[string]*simNMC
	pods       map[string]*simPod // worker pods by name
	dpPods     map[string]bool    // device plugin pods by node/module
	history    []snapshot
	conflict   bool
	nextUID    int
	violations []string
	reconciles int
	attempts   map[string]*attemptRecord // by node/module
	refuse     bool                      // the API server refuses the next worker pod
	refused    map[string]CreateRefusal  // refused pods by node/module, as the reconciler remembers them
}

func newWorld(f faults) *world {
	w := &world{faults: f, now: t0, nodes: map[string]*simNode{}, modules: map[string]*simModule{},
		nmcs: map[string]*simNMC{}, pods: map[string]*simPod{}, dpPods: map[string]bool{}, attempts: map[string]*attemptRecord{}, refused: map[string]CreateRefusal{}}
	for _, n := range modelNodes {
		w.nodes[n] = &simNode{labels: map[string]string{"role": "worker"}, ready: true, kernel: kernelA, boot: 1,
			readySince: t0.Add(-time.Hour), loaded: map[string]kmmv1beta1.ModuleConfig{}}
		w.nmcs[n] = &simNMC{spec: map[string]kmmv1beta1.NodeModuleSpec{}, status: map[string]kmmv1beta1.NodeModuleStatus{}}
	}
	w.modules[modPlain] = &simModule{exists: true, gen: 1}
	w.modules[modVersion] = &simModule{exists: true, gen: 1, version: "v1"}
	ns, name := splitKey(modVersion)
	for _, sn := range w.nodes {
		sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = "v1"
	}
	w.remember()
	return w
}

func (w *world) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

// remember records what the caches hold now, for controllers that act on a stale snapshot later.
func (w *world) remember() {
	s := snapshot{nmcs: map[string]simNMC{}, pods: map[string]simPod{}}
	for n, nmc := range w.nmcs {
		s.nmcs[n] = simNMC{spec: maps.Clone(nmc.spec), status: maps.Clone(nmc.status), rv: nmc.rv}
	}
	for name, p := range w.pods {
		s.pods[name] = *p
	}
	w.history = append(w.history, s)
	if len(w.history) > 4 {
		w.history = w.history[1:]
	}
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
	return &kmmv1beta1.Module{
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
}

func splitKey(key string) (string, string) {
	for i := range key {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

func podName(node, module string) string { return "kmm-worker-" + node + "-" + module }

func (w *world) nodeView(n string) NodeView {
	sn := w.nodes[n]
	return NodeView{Name: n, Labels: maps.Clone(sn.labels), KernelVersion: sn.kernel, Ready: sn.ready,
		Unschedulable: sn.cordoned, BootID: fmt.Sprint(sn.boot)}
}

// decideSpec is the Module→NMC decision, or its seeded fault.
func (w *world) decideSpec(m *kmmv1beta1.Module, v NodeView) SpecDecision {
	if w.faults.specReadsNodeStatus && !v.Ready {
		return SpecDecision{Action: SpecDelete, Reason: "NodeNotReady"}
	}
	return DecideSpec(m, v)
}

// reconcileModule is the Module→NMC controller for one Module on every node.
func (w *world) reconcileModule(key string) {
	w.reconciles++
	for _, n := range modelNodes {
		d := SpecDecision{Action: SpecDelete}
		if w.modules[key].exists {
			d = w.decideSpec(w.moduleObject(key), w.nodeView(n))
		}
		w.writeSpec(writerSpec, n, key, d)
	}
}

func (w *world) writeSpec(writer, node, key string, d SpecDecision) {
	if writer != writerSpec {
		w.violate("%s wrote the NMC spec of %s", writer, node)
	}
	nmc := w.nmcs[node]
	switch d.Action {
	case SpecUpdate:
		if old, ok := nmc.spec[key]; !ok || !equality.Semantic.DeepEqual(old, *d.Entry) {
			nmc.spec[key] = *d.Entry
			nmc.rv++
			delete(w.attempts, node+"/"+key) // a new spec: the back-off property starts afresh
		}
	case SpecDelete:
		if _, ok := nmc.spec[key]; ok {
			delete(nmc.spec, key)
			nmc.rv++
			delete(w.attempts, node+"/"+key)
		}
	}
}

// reconcileNMC is the NMC controller for one node, acting on the snapshot taken age steps ago.
func (w *world) reconcileNMC(node string, age int) {
	w.reconciles++
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
		r := Step(w.facts(node, key, nmc, snap))
		for _, tr := range r.Fired {
			visitedEdges[Edge{From: tr.From, Trigger: Trigger(tr.Trigger), To: tr.To}]++
		}
		if r.Err != nil {
			w.violate("unpermitted trigger for %s/%s: %v", node, key, r.Err)
		}
		if r.Status != nil {
			newStatus[key] = *r.Status
		}
		plans[key] = r.Plan
	}
	if !w.writeStatus(writerNMC, node, nmc.rv, nmc.status, newStatus, plans) {
		return
	}
	for _, key := range slices.Sorted(maps.Keys(plans)) {
		w.execute(node, key, plans[key], snap)
	}
}

func (w *world) facts(node, key string, nmc simNMC, snap snapshot) Facts {
	sn := w.nodes[node]
	ns, name := splitKey(key)
	f := Facts{Now: w.now, BackOff: DefaultBackOff, Status: kmmv1beta1.NodeModuleStatus{Namespace: ns, Name: name}}
	if w.faults.noWorkerTimeout {
		f.WorkerTimeout = 1000 * time.Hour
	}
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
	if p, ok := snap.pods[podName(node, name)]; ok {
		f.Worker = Worker{Phase: p.phase, Action: p.action, Attempt: p.attempt, Entry: p.entry, EntryKnown: true, Result: p.result, Created: p.created}
		if w.faults.failedEntryUnread && p.phase == PodFailed {
			f.Worker.Entry = kmmv1beta1.NodeModuleSpec{}
		}
	}
	f.DevicePluginRunning = w.dpPods[node+"/"+key]
	if r, ok := w.refused[node+"/"+key]; ok {
		f.CreateRefused = &r
	}
	w.applyNMCFaults(&f)
	return f
}

func (w *world) applyNMCFaults(f *Facts) {
	if w.faults.nmcIgnoresReady {
		f.Node.Ready = true
	}
	if w.faults.unloadIgnoresDevicePlugin {
		f.DevicePluginRunning = false
	}
	if w.faults.ignoresReboots {
		f.Node.BootID = f.Status.BootID
		f.Node.ReadySince = time.Time{}
	}
}

// writeStatus writes the NMC status with optimistic concurrency. A pod is only created after a
// successful write (a no-op write still checks the resourceVersion), so a stale snapshot never acts.
func (w *world) writeStatus(writer, node string, rv int, old, next map[string]kmmv1beta1.NodeModuleStatus, plans map[string]Plan) bool {
	if writer != writerNMC {
		w.violate("%s wrote the NMC status of %s", writer, node)
	}
	creates := false
	for _, p := range plans {
		creates = creates || p.CreateWorker != nil
	}
	changed := !equality.Semantic.DeepEqual(old, next)
	if !changed && !creates {
		return true
	}
	nmc := w.nmcs[node]
	if w.conflict || nmc.rv != rv {
		w.conflict = false
		return false
	}
	if changed {
		nmc.status = next
		nmc.rv++
	}
	return true
}

// execute carries out a pair's plan: node labels, finished-pod deletion, pod creation.
func (w *world) execute(node, key string, p Plan, snap snapshot) {
	sn := w.nodes[node]
	ns, name := splitKey(key)
	setLabel(sn.labels, kmmv1beta1.ReadyLabel(ns, name), "", p.Ready)
	setLabel(sn.labels, kmmv1beta1.VersionReadyLabel(ns, name), p.VersionReady, p.VersionReady != "")
	pn := podName(node, name)
	if p.DeleteWorker {
		if seen, ok := snap.pods[pn]; ok {
			if cur, ok := w.pods[pn]; ok && cur.uid == seen.uid {
				if seen.phase == PodRunning && cur.phase != PodRunning {
					return // the overdue pod finished since: the resourceVersion precondition fails
				}
				if cur.phase == PodRunning {
					w.killPod(cur) // an overdue pod: the kubelet stops it before its worker acted
				}
				delete(w.pods, pn) // delete with a UID precondition
			}
		}
	}
	if p.CreateWorker != nil {
		w.createPod(node, key, pn, p.CreateWorker)
	}
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
	if in.Action == ActionUnload && w.dpPods[node+"/"+key] {
		w.violate("invariant 6: unload pod for %s created on %s while its device plugin pod runs", key, node)
	}
	if cur, ok := sn.loaded[key]; ok && in.Action == ActionLoad && !equality.Semantic.DeepEqual(cur, in.Entry.Config) {
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
	w.pods[name] = &simPod{uid: w.nextUID, node: node, module: key, action: in.Action, attempt: in.Attempt,
		entry: *in.Entry.DeepCopy(), phase: PodRunning, created: w.now}
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
	p.phase, p.result = PodFailed, WorkerResult{Reason: "Other", Message: "killed"}
	w.recordAttempt(p)
}

// finishPod plays the kubelet and the worker for a running pod.
func (w *world) finishPod(p *simPod, succeed bool) {
	sn := w.nodes[p.node]
	if p.entry.Config.KernelVersion != sn.kernel {
		succeed = false // modprobe refuses a module built for another kernel
	}
	if p.action == ActionUnload && w.dpPods[p.node+"/"+p.module] {
		w.violate("invariant 6: unload of %s on %s ran while its device plugin pod runs", p.module, p.node)
	}
	p.result = WorkerResult{BootID: fmt.Sprint(sn.boot), ImageDigest: "sha256:" + p.entry.Config.ContainerImage}
	defer w.recordAttempt(p)
	if p.action == ActionLoad && strings.Contains(p.entry.Config.ContainerImage, brokenImageTag) {
		p.phase, p.result.Reason, p.result.Message = PodFailed, ReasonInvalidConfig, "invalid config"
		return
	}
	if !succeed {
		p.phase, p.result.Reason, p.result.Message = PodFailed, "Other", "injected failure"
		return
	}
	p.phase = PodSucceeded
	if p.action == ActionLoad {
		sn.loaded[p.module] = p.entry.Config
	} else {
		delete(sn.loaded, p.module)
	}
}

// reconcileLabels is the version label controller of package upgrade for the versioned Module.
func (w *world) reconcileLabels(node string) {
	sn := w.nodes[node]
	ns, name := splitKey(modVersion)
	st := w.nmcs[node].status[modVersion]
	loadedVersion := ""
	if st.Config != nil {
		loadedVersion = st.Config.Version
	}
	in := upgrade.NodeLabels{Target: sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)], WorkerPod: sn.labels[kmmv1beta1.WorkerPodVersionLabel(ns, name)],
		DevicePlugin: sn.labels[kmmv1beta1.DevicePluginVersionLabel(ns, name)]}
	out := upgrade.NextLabels(in, upgrade.Observed{DevicePluginPodOnNode: w.dpPods[node+"/"+modVersion], LoadedVersion: loadedVersion, Loaded: st.State == Loaded})
	setLabel(sn.labels, kmmv1beta1.WorkerPodVersionLabel(ns, name), out.WorkerPod, out.WorkerPod != "")
	setLabel(sn.labels, kmmv1beta1.DevicePluginVersionLabel(ns, name), out.DevicePlugin, out.DevicePlugin != "")
}

// reconcileDaemonSets plays the DaemonSet controller: a device plugin pod runs where the node has
// the ready label (and, for a versioned Module, a version-device-plugin label).
func (w *world) reconcileDaemonSets(node string) {
	sn := w.nodes[node]
	for _, key := range modelModules {
		ns, name := splitKey(key)
		want := w.modules[key].exists && hasLabel(sn.labels, kmmv1beta1.ReadyLabel(ns, name))
		if key == modVersion {
			want = want && sn.labels[kmmv1beta1.DevicePluginVersionLabel(ns, name)] != ""
		}
		if want {
			w.dpPods[node+"/"+key] = true
		} else {
			delete(w.dpPods, node+"/"+key)
		}
	}
}

func hasLabel(labels map[string]string, key string) bool {
	_, ok := labels[key]
	return ok
}

func (w *world) reboot(node string) {
	sn := w.nodes[node]
	sn.boot++
	sn.readySince = w.now
	clear(sn.loaded)
	for _, p := range w.pods {
		if p.node == node && p.phase == PodRunning {
			p.phase, p.result = PodFailed, WorkerResult{Reason: "Other", Message: "node rebooted"}
		}
	}
	for pair := range w.attempts {
		if strings.HasPrefix(pair, node+"/") {
			delete(w.attempts, pair) // a reboot starts afresh
		}
	}
	for _, key := range modelModules {
		delete(w.dpPods, node+"/"+key)
	}
}

// check verifies the invariants that hold at every step.
func (w *world) check() {
	w.checkSpecIgnoresNodeStatus()
	perPair := map[string]int{}
	for _, p := range w.pods {
		perPair[p.node+"/"+p.module]++
		if p.action == ActionUnload && p.phase == PodRunning && w.dpPods[p.node+"/"+p.module] {
			w.violate("invariant 6: unload pod of %s running on %s next to its device plugin pod", p.module, p.node)
		}
	}
	for pair, n := range perPair {
		if n > 1 {
			w.violate("invariant 3: %d worker pods for %s", n, pair)
		}
	}
	for node, nmc := range w.nmcs {
		for key, st := range nmc.status {
			w.checkRecord(node, key, st)
		}
	}
}

// checkSpecIgnoresNodeStatus is invariant 1: changing node status alone changes no decision.
func (w *world) checkSpecIgnoresNodeStatus() {
	for _, key := range modelModules {
		if !w.modules[key].exists {
			continue
		}
		m := w.moduleObject(key)
		for _, n := range modelNodes {
			v := w.nodeView(n)
			flipped := v
			flipped.Ready, flipped.Unschedulable, flipped.BootID = !v.Ready, !v.Unschedulable, v.BootID+"x"
			if a, b := w.decideSpec(m, v), w.decideSpec(m, flipped); !reflect.DeepEqual(a, b) {
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

// settle stops the events (nodes Ready and uncordoned, upgrades finished, pods succeed) and runs
// every controller until nothing changes; it returns false if that takes more than maxRounds.
func (w *world) settle(maxRounds int) bool {
	w.conflict, w.refuse = false, false
	for _, sn := range w.nodes {
		if !sn.ready {
			sn.ready, sn.readySince = true, w.now
		}
		sn.cordoned = false
		ns, name := splitKey(modVersion)
		if _, ok := sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)]; ok && w.modules[modVersion].exists {
			sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = w.modules[modVersion].version
		}
	}
	for range maxRounds {
		before := w.fingerprint()
		w.now = w.now.Add(10 * time.Minute)
		for _, p := range w.pods {
			if p.phase == PodRunning && !p.hung {
				w.finishPod(p, true)
			}
		}
		for _, key := range modelModules {
			w.reconcileModule(key)
		}
		for _, n := range modelNodes {
			w.reconcileLabels(n)
			w.reconcileDaemonSets(n)
			w.remember()
			w.reconcileNMC(n, 0)
		}
		if w.fingerprint() == before {
			return true
		}
	}
	return false
}

// describe prints the pairs and pods, for a failure message.
func (w *world) describe() string {
	s := ""
	for _, n := range modelNodes {
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

func (w *world) fingerprint() string {
	s := ""
	for _, n := range modelNodes {
		s += fmt.Sprintf("%v|%v|%v|", w.nodes[n].labels, w.nmcs[n].rv, len(w.nodes[n].loaded))
	}
	for _, name := range slices.Sorted(maps.Keys(w.pods)) {
		s += fmt.Sprintf("%s:%d:%s|", name, w.pods[name].uid, w.pods[name].phase)
	}
	return s + fmt.Sprint(len(w.dpPods))
}

// checkConverged is invariants 5 and 7: every pair is Loaded with its spec config (and the kernel
// really has it) or Absent with nothing loaded.
func (w *world) checkConverged() {
	for _, n := range modelNodes {
		sn, nmc := w.nodes[n], w.nmcs[n]
		for _, key := range modelModules {
			spec, hasSpec := nmc.spec[key]
			st := nmc.status[key]
			cur, loaded := sn.loaded[key]
			if hasSpec && spec.Config.KernelVersion == sn.kernel && w.modules[key].broken != "" {
				// A config no worker can act on: failed for good, nothing loaded, no pod, until it changes.
				if st.State != LoadBackOff || st.Reason != ReasonInvalidConfig || loaded || w.pods[podName(n, key[len("ns/"):])] != nil && w.pods[podName(n, key[len("ns/"):])].phase == PodRunning {
					w.violate("invariant 7: %s on %s has a config no worker accepts: %s/%s (loaded in kernel: %v), want LoadBackOff InvalidConfig; log %v",
						key, n, st.State, st.Reason, loaded, st.Transitions)
				}
				continue
			}
			if hasSpec && spec.Config.KernelVersion == sn.kernel {
				if st.State != Loaded || st.Config == nil || !equality.Semantic.DeepEqual(*st.Config, spec.Config) || !loaded ||
					!equality.Semantic.DeepEqual(cur, spec.Config) {
					w.violate("invariant 7/5: %s on %s is %s (loaded in kernel: %v), want Loaded with %s; node %+v; pod %+v; log %v",
						key, n, st.State, loaded, spec.Config.ContainerImage, *sn, w.pods[podName(n, key[len("ns/"):])], st.Transitions)
				}
				continue
			}
			if (st.State != "" && st.State != Absent) || loaded {
				w.violate("invariant 7: %s on %s is %s (loaded in kernel: %v), want Absent", key, n, st.State, loaded)
			}
		}
	}
}

// model adapts the world to rapid's state machine actions.
type model struct {
	w *world
}

func (m *model) pickNode(t *rapid.T) *simNode {
	return m.w.nodes[rapid.SampledFrom(modelNodes).Draw(t, "node")]
}

func (m *model) CreateModule(t *rapid.T) {
	key := rapid.SampledFrom(modelModules).Draw(t, "module")
	sm := m.w.modules[key]
	if !sm.exists {
		sm.exists, sm.gen = true, sm.gen+1
		if key == modVersion {
			sm.version = fmt.Sprintf("v%d", sm.gen)
		}
	}
}

func (m *model) EditModuleImage(t *rapid.T) {
	if sm := m.w.modules[modPlain]; sm.exists {
		sm.gen++
	}
}

// RevertModuleImage puts the previous image back, as an administrator undoing an edit does.
func (m *model) RevertModuleImage(t *rapid.T) {
	if sm := m.w.modules[modPlain]; sm.exists && sm.gen > 1 {
		sm.gen--
	}
}

// BreakOrFixModule gives modPlain a config no worker can act on (one only the worker refuses, or
// one the operator's own check refuses), or a working one again.
func (m *model) BreakOrFixModule(t *rapid.T) {
	sm := m.w.modules[modPlain]
	if !sm.exists {
		return
	}
	if sm.broken != "" {
		sm.broken = ""
	} else {
		sm.broken = rapid.SampledFrom([]string{"worker", "operator"}).Draw(t, "broken")
	}
	sm.gen++
}

func (m *model) BumpModuleVersion(t *rapid.T) {
	if sm := m.w.modules[modVersion]; sm.exists {
		sm.gen++
		sm.version = fmt.Sprintf("v%d", sm.gen)
	}
}

func (m *model) DeleteModule(t *rapid.T) {
	m.w.modules[rapid.SampledFrom(modelModules).Draw(t, "module")].exists = false
}

func (m *model) RebootNode(t *rapid.T) {
	m.w.reboot(rapid.SampledFrom(modelNodes).Draw(t, "node"))
}

func (m *model) UpgradeKernel(t *rapid.T) {
	n := rapid.SampledFrom(modelNodes).Draw(t, "node")
	m.w.nodes[n].kernel = rapid.SampledFrom(modelKernels).Draw(t, "kernel")
	m.w.reboot(n)
}

func (m *model) FlapNotReady(t *rapid.T) { m.pickNode(t).ready = false }

func (m *model) FlapReady(t *rapid.T) {
	if sn := m.pickNode(t); !sn.ready {
		sn.ready, sn.readySince = true, m.w.now
	}
}

// FlapNode is a NotReady/Ready flap without a reboot: the Ready transition time moves, the
// kernel keeps its modules.
func (m *model) FlapNode(t *rapid.T) {
	sn := m.pickNode(t)
	sn.ready, sn.readySince = true, m.w.now.Add(time.Second)
}

func (m *model) Cordon(t *rapid.T) {
	sn := m.pickNode(t)
	sn.cordoned = !sn.cordoned
}

func (m *model) SetVersionLabel(t *rapid.T) {
	sn := m.pickNode(t)
	ns, name := splitKey(modVersion)
	if rapid.IntRange(0, 4).Draw(t, "remove") == 0 || !m.w.modules[modVersion].exists {
		delete(sn.labels, kmmv1beta1.ModuleVersionLabel(ns, name))
		return
	}
	sn.labels[kmmv1beta1.ModuleVersionLabel(ns, name)] = m.w.modules[modVersion].version
}

func (m *model) runningPod(t *rapid.T) *simPod {
	var running []string
	for name, p := range m.w.pods {
		if p.phase == PodRunning {
			running = append(running, name)
		}
	}
	if len(running) == 0 {
		return nil
	}
	slices.Sort(running)
	return m.w.pods[rapid.SampledFrom(running).Draw(t, "pod")]
}

func (m *model) WorkerSucceeds(t *rapid.T) {
	if p := m.runningPod(t); p != nil {
		m.w.finishPod(p, true)
	}
}

func (m *model) WorkerFails(t *rapid.T) {
	if p := m.runningPod(t); p != nil {
		m.w.finishPod(p, false)
	}
}

// WorkerHangs makes a running pod never finish unless an action finishes it.
func (m *model) WorkerHangs(t *rapid.T) {
	if p := m.runningPod(t); p != nil {
		p.hung = true
	}
}

func (m *model) WorkerEvicted(t *rapid.T) {
	if p := m.runningPod(t); p != nil {
		delete(m.w.pods, podName(p.node, p.module[len("ns/"):]))
	}
}

func (m *model) ReconcileModule(t *rapid.T) {
	m.w.reconcileModule(rapid.SampledFrom(modelModules).Draw(t, "module"))
}

func (m *model) ReconcileNMC(t *rapid.T) {
	m.w.reconcileNMC(rapid.SampledFrom(modelNodes).Draw(t, "node"), 0)
}

func (m *model) ReconcileNMCFromStaleCache(t *rapid.T) {
	m.w.reconcileNMC(rapid.SampledFrom(modelNodes).Draw(t, "node"), rapid.IntRange(1, 3).Draw(t, "age"))
}

func (m *model) ReconcileVersionLabels(t *rapid.T) {
	m.w.reconcileLabels(rapid.SampledFrom(modelNodes).Draw(t, "node"))
}

func (m *model) ReconcileDaemonSets(t *rapid.T) {
	m.w.reconcileDaemonSets(rapid.SampledFrom(modelNodes).Draw(t, "node"))
}

// ControllersCatchUp runs every controller once on every node, as happens when events settle.
func (m *model) ControllersCatchUp(*rapid.T) {
	for _, key := range modelModules {
		m.w.reconcileModule(key)
	}
	for _, n := range modelNodes {
		m.w.reconcileLabels(n)
		m.w.remember()
		m.w.reconcileNMC(n, 0)
		m.w.reconcileDaemonSets(n)
	}
}

// APIRefuses makes the API server refuse the next NMC status write (a conflict) or the next worker
// pod (a policy, a quota).
func (m *model) APIRefuses(t *rapid.T) {
	if rapid.Bool().Draw(t, "pod") {
		m.w.refuse = true
	} else {
		m.w.conflict = true
	}
}

// RestartOperator drops every cache: the next reconciles start from what the API server holds.
func (m *model) RestartOperator(*rapid.T) {
	m.w.history = nil
	m.w.remember()
}

func (m *model) Tick(t *rapid.T) {
	m.w.now = m.w.now.Add(time.Duration(rapid.IntRange(1, 600).Draw(t, "seconds")) * time.Second)
}

// Check runs after every action.
func (m *model) Check(t *rapid.T) {
	m.w.remember()
	m.w.check()
	if len(m.w.violations) > 0 {
		t.Fatalf("%s", m.w.violations[0])
	}
}

// runModel is one random interleaving followed by the convergence check.
func runModel(f faults) func(*rapid.T) {
	return func(t *rapid.T) {
		m := &model{w: newWorld(f)}
		t.Repeat(rapid.StateMachineActions(m))
		if !m.w.settle(30) {
			t.Fatalf("invariant 7: the world did not settle within 30 rounds of reconciles: %s", m.w.describe())
		}
		m.w.check()
		m.w.checkConverged()
		if len(m.w.violations) > 0 {
			t.Fatalf("%s", m.w.violations[0])
		}
	}
}
