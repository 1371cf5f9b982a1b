package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/testbed"
)

// The images of the bump tests: the load's (tb.Module's mapping for KernelA) and the bump's.
const (
	imageBefore = "reg.example.com/nic:a"
	imageAfter  = "reg.example.com/nic:a2"
)

// TestImageBumpIsOneReloadWorker: the image bump of a Module without version and device plugin
// (docs/api.md, "Image changes: one reload worker") is one worker pod, labelled reload, whose
// config unloads the old image and loads the new one; the pair goes Loaded -> Loading -> Loaded
// and ends with the new image in its status and in the node's kernel; the ready label never leaves
// the node.
func TestImageBumpIsOneReloadWorker(t *testing.T) {
	tb, n, w, m := loadForBump(t, nil)
	logBefore := len(cluster.PairStatus(n, tb.NS, "nic").Transitions)

	setFirstImage(t, m, imageAfter)
	tb.WaitLoaded("nic", imageAfter, n)
	w.waitSettled(t, imageAfter)

	bump := w.created()[1:]
	if actions := podActions(bump); !slices.Equal(actions, []contract.Action{contract.ActionReload}) {
		t.Errorf("worker pods created for the bump: %v, want one reload pod", actions)
	} else if cfg := bump[0].cfg; cfg.Previous == nil || cfg.Previous.ContainerImage != imageBefore || cfg.Config.ContainerImage != imageAfter {
		t.Errorf("the reload pod's config unloads %s and loads %s, want %s then %s", previousImage(cfg), cfg.Config.ContainerImage, imageBefore, imageAfter)
	}
	if r := lastRun(n, tb.NS+"/nic"); r.Action != contract.ActionReload || r.Result.Outcome != contract.OutcomeSucceeded {
		t.Errorf("the agent's last run of nic: %s %s, want a succeeded reload", r.Action, r.Result.Outcome)
	}
	st := cluster.PairStatus(n, tb.NS, "nic")
	if st.State != kmmv1beta1.StateLoaded || st.Config.ContainerImage != imageAfter || st.ImageDigest != agent.ImageDigest(imageAfter) || st.Attempts != 0 {
		t.Errorf("status after the bump: %s digest %s, want Loaded with %s (digest %s), 0 attempts",
			testbed.Describe(st), st.ImageDigest, imageAfter, agent.ImageDigest(imageAfter))
	}
	assertLogged(t, st.Transitions[logBefore:],
		step(fsm.SpecChanged, kmmv1beta1.StateLoaded, kmmv1beta1.StateLoading),
		step(fsm.WorkerSucceeded, kmmv1beta1.StateLoading, kmmv1beta1.StateLoaded))
	if has, removals := w.label(); !has || removals != 0 {
		t.Errorf("ready label on the node: %v, removed %d times since the load; want kept through the reload", has, removals)
	}
}

// TestImageBumpWithDevicePluginUnloadsThenLoads is the boundary of the reload: with the Module's
// device plugin pod on the node, the bump drains it and runs an unload pod, then a load pod, and
// the ready label goes (the device plugin DaemonSet selects on it) and comes back.
func TestImageBumpWithDevicePluginUnloadsThenLoads(t *testing.T) {
	tb, n, w, m := loadForBump(t, func(m *kmmv1beta1.Module) {
		m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"}}
	})
	waitDevicePluginReady(t, tb, n)
	logBefore := len(cluster.PairStatus(n, tb.NS, "nic").Transitions)

	setFirstImage(t, m, imageAfter)
	tb.WaitLoaded("nic", imageAfter, n)
	w.waitSettled(t, imageAfter)

	bump := w.created()[1:]
	if actions := podActions(bump); !slices.Equal(actions, []contract.Action{contract.ActionUnload, contract.ActionLoad}) {
		t.Errorf("worker pods created for the bump: %v, want an unload pod then a load pod", actions)
	} else if bump[0].cfg.Config.ContainerImage != imageBefore || bump[1].cfg.Config.ContainerImage != imageAfter {
		t.Errorf("the unload pod has %s and the load pod %s, want %s and %s", bump[0].cfg.Config.ContainerImage, bump[1].cfg.Config.ContainerImage, imageBefore, imageAfter)
	}
	assertLogged(t, cluster.PairStatus(n, tb.NS, "nic").Transitions[logBefore:],
		step(fsm.SpecChanged, kmmv1beta1.StateLoaded, kmmv1beta1.StateDevicePluginDraining),
		step(fsm.DevicePluginGone, kmmv1beta1.StateDevicePluginDraining, kmmv1beta1.StateUnloading),
		step(fsm.WorkerSucceeded, kmmv1beta1.StateUnloading, kmmv1beta1.StateAbsent),
		step(fsm.SpecSet, kmmv1beta1.StateAbsent, kmmv1beta1.StateLoading),
		step(fsm.WorkerSucceeded, kmmv1beta1.StateLoading, kmmv1beta1.StateLoaded))
	if has, removals := w.label(); !has || removals != 1 {
		t.Errorf("ready label on the node: %v, removed %d times since the load; want removed once for the unload and back", has, removals)
	}
}

// TestFailedReloadKeepsTheOldModule: a reload whose new image cannot be pulled fails in its unload
// half (the worker pulls both images first): the pair goes to UnloadBackOff with the old config
// still recorded and still in the kernel, reason ImagePull, a message saying the old config stays,
// one Warning Event and the ready label gone with the state; after the back-off a plain unload pod
// runs, and a fixed image then loads.
func TestFailedReloadKeepsTheOldModule(t *testing.T) {
	// A back-off long enough to see the pair in UnloadBackOff (the package's 1 s is not).
	saved := testbed.BackOff
	testbed.BackOff = fsm.BackOff{Base: 3 * time.Second, Max: 4 * time.Second}
	t.Cleanup(func() { testbed.BackOff = saved })
	tb, n, w, m := loadForBump(t, nil)
	logBefore := len(cluster.PairStatus(n, tb.NS, "nic").Transitions)
	// Unload pods stay Running: the kernel keeps what the failed reload left until the test looks.
	node.SetHold(func(p *corev1.Pod) bool {
		return p.Namespace == tb.NS && p.Labels[contract.LabelAction] == string(contract.ActionUnload)
	})
	t.Cleanup(func() { node.SetHold(nil) })

	setFirstImage(t, m, "reg.example.com/nic:broken")
	var st kmmv1beta1.NodeModuleStatus
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		var ok bool
		st, ok = w.first(kmmv1beta1.StateUnloadBackOff)
		return ok, "the pair in UnloadBackOff, now " + testbed.Describe(cluster.PairStatus(n, tb.NS, "nic"))
	})
	// The ready label goes with Loaded, before the back-off is over.
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		has, removals := w.label()
		return !has && removals == 1, fmt.Sprintf("the ready label gone with Loaded (on the node: %v, removals %d)", has, removals)
	})
	if now := cluster.PairStatus(n, tb.NS, "nic"); now.State != kmmv1beta1.StateUnloadBackOff {
		t.Errorf("the ready label went only after UnloadBackOff, in %s", testbed.Describe(now))
	}
	if st.Config == nil || st.Config.ContainerImage != imageBefore || st.Reason != "ImagePull" || st.Attempts != 1 ||
		!strings.HasPrefix(st.Message, "reload: the old config stays loaded") {
		t.Errorf("UnloadBackOff entry: %s; want the old image %s recorded, reason ImagePull, 1 attempt, a message saying the old config stays", testbed.Describe(&st), imageBefore)
	}
	assertLogged(t, st.Transitions[logBefore:],
		step(fsm.SpecChanged, kmmv1beta1.StateLoaded, kmmv1beta1.StateLoading),
		kmmv1beta1.Transition{Trigger: string(fsm.WorkerFailed), From: kmmv1beta1.StateLoading, To: kmmv1beta1.StateUnloadBackOff, Reason: "ImagePull"})
	if got := node.Loaded(n)[tb.NS+"/nic"]; got.ContainerImage != imageBefore {
		t.Errorf("the kernel has %q loaded after the failed reload, want the old %s", got.ContainerImage, imageBefore)
	}
	if r := lastRun(n, tb.NS+"/nic"); r.Action != contract.ActionReload || r.Result.FailedStep != contract.StepUnload {
		t.Errorf("the agent's last run of nic: %s failed step %q, want a reload failed in its unload half", r.Action, r.Result.FailedStep)
	}
	assertOneReloadWarning(t, tb, n)

	// After the back-off: a plain unload pod for the old config (held Running), then a fixed image loads.
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		actions := podActions(w.created())
		return slices.Equal(actions, []contract.Action{contract.ActionLoad, contract.ActionReload, contract.ActionUnload}),
			fmt.Sprintf("worker pods %v, want load, reload, unload", actions)
	})
	if cfg := w.created()[2].cfg; cfg.Config.ContainerImage != imageBefore {
		t.Errorf("the unload pod after the failed reload unloads %s, want %s", cfg.Config.ContainerImage, imageBefore)
	}
	setFirstImage(t, m, imageAfter)
	node.SetHold(nil)
	tb.WaitLoaded("nic", imageAfter, n)
	w.waitSettled(t, imageAfter)
	want := []contract.Action{contract.ActionLoad, contract.ActionReload, contract.ActionUnload, contract.ActionLoad}
	if actions := podActions(w.created()); !slices.Equal(actions, want) {
		t.Errorf("worker pods %v, want %v (a load last: nothing is loaded after the unload)", actions, want)
	}
}

// bumpWatch records, from the start of a test, what one pair on one node goes through: the worker
// pods of its Module in the order they were created, the distinct states of its NMC status entry,
// and the ready label on the node.
type bumpWatch struct {
	mu       sync.Mutex
	pods     []watchedPod
	live     map[types.UID]bool
	entries  []kmmv1beta1.NodeModuleStatus
	hasLabel bool
	removals int
}

// watchedPod is a worker pod as first seen, with the config its annotation carries.
type watchedPod struct {
	uid    types.UID
	action contract.Action
	cfg    contract.Config
}

// loadForBump starts the operator on a bed of one node, creates the Module "nic" (changed by edit
// first, when not nil) and waits until it is loaded with imageBefore, watched by a bumpWatch.
func loadForBump(t *testing.T, edit func(*kmmv1beta1.Module)) (*testbed.Bed, string, *bumpWatch, *kmmv1beta1.Module) {
	t.Helper()
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	w := watchBump(t, tb, n, "nic")
	m := tb.Module("nic")
	if edit != nil {
		edit(m)
	}
	tb.Create(m)
	tb.WaitLoaded("nic", imageBefore, n)
	w.waitLoad(t)
	return tb, n, w, m
}

func watchBump(t *testing.T, tb *testbed.Bed, n, module string) *bumpWatch {
	t.Helper()
	w := &bumpWatch{live: map[types.UID]bool{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, w.observePod, client.InNamespace(tb.NS),
		client.MatchingLabels{contract.LabelWorker: "true", contract.LabelModuleName: module})
	testbed.Watch(t, cluster, &kmmv1beta1.NodeModulesConfigList{}, func(_ watch.EventType, nmc *kmmv1beta1.NodeModulesConfig) {
		if nmc.Name == n {
			w.observeEntry(nmc.StatusEntry(tb.NS, module))
		}
	})
	ready := kmmv1beta1.ReadyLabel(tb.NS, module)
	testbed.Watch(t, cluster, &corev1.NodeList{}, func(_ watch.EventType, no *corev1.Node) {
		if no.Name != n {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		_, has := no.Labels[ready]
		if w.hasLabel && !has {
			w.removals++
		}
		w.hasLabel = has
	})
	return w
}

func (w *bumpWatch) observePod(ev watch.EventType, p *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ev == watch.Deleted {
		delete(w.live, p.UID)
		return
	}
	if slices.ContainsFunc(w.pods, func(s watchedPod) bool { return s.uid == p.UID }) {
		return
	}
	cfg, _ := contract.ParseConfig([]byte(p.Annotations[contract.AnnotationConfig])) // a bad one shows as an empty config
	w.pods = append(w.pods, watchedPod{uid: p.UID, action: contract.Action(p.Labels[contract.LabelAction]), cfg: cfg})
	w.live[p.UID] = true
}

func (w *bumpWatch) observeEntry(st *kmmv1beta1.NodeModuleStatus) {
	if st == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if k := len(w.entries); k == 0 || w.entries[k-1].State != st.State {
		w.entries = append(w.entries, *st.DeepCopy())
	}
}

// created is every worker pod seen so far, oldest first.
func (w *bumpWatch) created() []watchedPod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.pods)
}

// first is the first status entry seen in state s.
func (w *bumpWatch) first(s kmmv1beta1.ModuleState) (kmmv1beta1.NodeModuleStatus, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.entries {
		if e.State == s {
			return *e.DeepCopy(), true
		}
	}
	return kmmv1beta1.NodeModuleStatus{}, false
}

// label says whether the node has the ready label and how often the watch saw it removed.
func (w *bumpWatch) label() (bool, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hasLabel, w.removals
}

// waitSettled waits until the watch saw a worker pod that loads image (a load or a reload) and
// every pod deleted (the operator deletes a finished pod once its outcome is recorded), and the
// ready label set; the callers check which pods there were.
func (w *bumpWatch) waitSettled(t *testing.T, image string) {
	t.Helper()
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		loads := slices.ContainsFunc(w.pods, func(p watchedPod) bool {
			return p.action != contract.ActionUnload && p.cfg.Config.ContainerImage == image
		})
		return loads && len(w.live) == 0 && w.hasLabel,
			fmt.Sprintf("worker pods %v (%d not deleted), want one that loads %s, all deleted; ready label %v", podActions(w.pods), len(w.live), image, w.hasLabel)
	})
}

// waitLoad waits until the first load settled and checks it was one load pod.
func (w *bumpWatch) waitLoad(t *testing.T) {
	t.Helper()
	w.waitSettled(t, imageBefore)
	if actions := podActions(w.created()); !slices.Equal(actions, []contract.Action{contract.ActionLoad}) {
		t.Fatalf("worker pods for the load: %v, want one load pod", actions)
	}
}

func podActions(pods []watchedPod) []contract.Action {
	var out []contract.Action
	for _, p := range pods {
		out = append(out, p.action)
	}
	return out
}

func previousImage(cfg contract.Config) string {
	if cfg.Previous == nil {
		return "nothing"
	}
	return cfg.Previous.ContainerImage
}

// lastRun is the last run the agent ended for module on node.
func lastRun(n, module string) agent.Run {
	var last agent.Run
	for _, r := range node.Runs() {
		if r.Node == n && r.Module == module {
			last = r
		}
	}
	return last
}

func step(trigger fsm.Trigger, from, to kmmv1beta1.ModuleState) kmmv1beta1.Transition {
	return kmmv1beta1.Transition{Trigger: string(trigger), From: from, To: to, Reason: string(trigger)}
}

// assertLogged checks that the transition log entries got are want (time left out).
func assertLogged(t *testing.T, got []kmmv1beta1.Transition, want ...kmmv1beta1.Transition) {
	t.Helper()
	brief := func(trs []kmmv1beta1.Transition) []string {
		var out []string
		for _, tr := range trs {
			out = append(out, fmt.Sprintf("%s -> %s (%s, %s)", tr.From, tr.To, tr.Trigger, tr.Reason))
		}
		return out
	}
	if g, w := brief(got), brief(want); !slices.Equal(g, w) {
		t.Errorf("transition log since the load:\n  %s\nwant\n  %s", strings.Join(g, "\n  "), strings.Join(w, "\n  "))
	}
}

// assertOneReloadWarning waits for the Warning Events of the failed reload's transition, one on the
// Module and one on node n's NMC, and checks each is the only one (a series would count repeats)
// and says that the old config stays loaded. The Module's Degraded condition has an Event of its
// own (action StateChanged), not counted here.
func assertOneReloadWarning(t *testing.T, tb *testbed.Bed, n string) {
	t.Helper()
	var onModule, onNMC []eventsv1.Event
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		onModule, onNMC = nil, nil
		for _, ns := range []string{tb.NS, metav1.NamespaceDefault} {
			evs := &eventsv1.EventList{}
			_ = k8s.List(context.Background(), evs, client.InNamespace(ns))
			for _, e := range evs.Items {
				if e.Type != corev1.EventTypeWarning || e.Action != "Transition" {
					continue
				}
				switch {
				case e.Regarding.Kind == "Module" && e.Regarding.Namespace == tb.NS && e.Regarding.Name == "nic":
					onModule = append(onModule, e)
				case e.Regarding.Kind == "NodeModulesConfig" && e.Regarding.Name == n && e.Related != nil && e.Related.Namespace == tb.NS && e.Related.Name == "nic":
					onNMC = append(onNMC, e)
				}
			}
		}
		return len(onModule) > 0 && len(onNMC) > 0, fmt.Sprintf("Warning transition Events: %d on the Module, %d on the NMC", len(onModule), len(onNMC))
	})
	for what, evs := range map[string][]eventsv1.Event{"the Module": onModule, "the NMC": onNMC} {
		e := evs[0]
		if len(evs) != 1 || e.Reason != "ImagePull" || !strings.Contains(e.Note, "reload: the old config stays loaded") || (e.Series != nil && e.Series.Count > 1) {
			t.Errorf("%d Warning transition Events on %s, the first %s %q (series %v); want one ImagePull saying the old config stays",
				len(evs), what, e.Reason, e.Note, e.Series)
		}
	}
}

// waitDevicePluginReady waits until the Module's device plugin pod runs Ready on node n (the
// DaemonSet's pod, scheduled by kube-controller-manager and run by the agent).
func waitDevicePluginReady(t *testing.T, tb *testbed.Bed, n string) {
	t.Helper()
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		if err := k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.MatchingLabels{contract.LabelDevicePlugin: "true"}); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if p.Spec.NodeName == n && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("a Ready device plugin pod on %s among %d", n, len(pods.Items))
	})
}
