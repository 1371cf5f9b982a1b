package upgrade

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

const tKernel = "6.1.0-1-amd64"

// running gives a node its kernel and, when Loaded, the config of its loaded version in its NMC status.
func running(n RolloutNode) RolloutNode {
	n.KernelVersion = tKernel
	if n.State == kmmv1beta1.StateLoaded {
		n.Running = &kmmv1beta1.PreviousConfig{ServiceAccountName: "sa", Config: kmmv1beta1.ModuleConfig{
			KernelVersion: tKernel, ContainerImage: "reg/nic:" + n.LoadedVersion, Version: n.LoadedVersion,
			Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "nic"}}}
	}
	return n
}

func withKernel(n RolloutNode, kernel string) RolloutNode {
	n = running(n)
	n.KernelVersion = kernel
	if n.Running != nil {
		n.Running.Config.KernelVersion = kernel
	}
	return n
}

// step runs DecideRollout with the last status fed back, as the controller does.
func step(m *kmmv1beta1.Module, now time.Time, ns ...RolloutNode) RolloutDecision {
	d := DecideRollout(RolloutInput{Module: m, Nodes: ns, Now: now})
	m.Status.Rollout = d.Status
	return d
}

// rollbackModule is v2 with maxUnavailable 1, maxFailed 1 and rollbackFailed, whose last status
// rolled out v1 (the previous version).
func rollbackModule() *kmmv1beta1.Module {
	one := intstr.FromInt32(1)
	m := rolloutModule("v2", &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one, MaxFailed: &one, RollbackFailed: true})
	m.Status.Rollout = &kmmv1beta1.RolloutStatus{Version: "v1"}
	return m
}

func TestPreviousVersion(t *testing.T) {
	m := rollbackModule()
	var ns []RolloutNode
	for i := range 10 { // ten kernels: at most MaxPreviousConfigs are kept
		ns = append(ns, withKernel(onV1(string(rune('a'+i))), "6.1.0-"+string(rune('0'+i))))
	}
	ns = append(ns, withKernel(onV1("z"), "6.1.0-0")) // a second node on a kernel seen: no second config
	d := step(m, tNow, ns...)
	p := d.Status.Previous
	if p == nil || p.Version != "v1" || len(p.Configs) != kmmv1beta1.MaxPreviousConfigs {
		t.Fatalf("previous = %+v, want v1 with %d configs", p, kmmv1beta1.MaxPreviousConfigs)
	}
	if !slices.IsSortedFunc(p.Configs, func(a, b kmmv1beta1.PreviousConfig) int {
		return strings.Compare(a.Config.KernelVersion, b.Config.KernelVersion)
	}) || p.Configs[0].ServiceAccountName != "sa" || p.Configs[0].Config.ContainerImage != "reg/nic:v1" {
		t.Fatalf("configs %+v: want them by kernel, with the pod settings", p.Configs)
	}
	// The next step of the same version keeps them, though no node runs v1 any more.
	d = step(m, tNow, running(onV2("a")))
	if d.Status.Previous == nil || len(d.Status.Previous.Configs) != kmmv1beta1.MaxPreviousConfigs {
		t.Fatalf("previous after the nodes moved = %+v, want it kept", d.Status.Previous)
	}
	// A new version: the previous one is the version just rolled out, from the nodes running it.
	m.Spec.ModuleLoader.Container.Version = "v3"
	d = step(m, tNow, running(onV2("a")), running(onV1("b")))
	if p := d.Status.Previous; p == nil || p.Version != "v2" || len(p.Configs) != 1 || p.Configs[0].Config.Version != "v2" {
		t.Fatalf("previous of v3 = %+v, want v2's config", p)
	}
	// No status: the one other version loaded; none when the nodes run several.
	fresh := rolloutModule("v2", auto(intOf(1)))
	if p := DecideRollout(RolloutInput{Module: fresh, Nodes: []RolloutNode{running(onV1("a"))}}).Status.Previous; p == nil || p.Version != "v1" {
		t.Fatalf("previous without status = %+v, want v1", p)
	}
	v0 := running(onV1("b"))
	v0.LoadedVersion = "v0"
	if p := DecideRollout(RolloutInput{Module: fresh, Nodes: []RolloutNode{running(onV1("a")), v0}}).Status.Previous; p != nil {
		t.Fatalf("previous with two other versions loaded = %+v, want none", p)
	}
}

func TestRollbackOfFailedNodes(t *testing.T) {
	m := rollbackModule()
	step(m, tNow, running(onV1("a")), running(onV1("b")), running(onV1("c")))
	failed := running(backingOff("a"))
	d := step(m, tNow, failed, running(onV1("b")), running(onV1("c")))
	if d.Status.Paused == nil || !reflect.DeepEqual(d.Intents, to("v1", "a")) || !d.RollbackStarted {
		t.Fatalf("paused %v, intents %v, started %v: want paused at the budget and a back to v1 at once", d.Status.Paused, d.Intents, d.RollbackStarted)
	}
	rb := d.Status.Rollback
	if rb == nil || rb.Reason != kmmv1beta1.ReasonRollbackFailedNodes || rb.Version != "v1" || !reflect.DeepEqual(rb.Nodes, []string{"a"}) {
		t.Fatalf("rollback = %+v, want FailedNodes of a to v1", rb)
	}
	// On its way back: RollingBack (unavailable), nothing else starts, no second Event.
	back := running(upgrading("a", kmmv1beta1.StateUnloading, ""))
	back.Labels = map[string]string{tLabel: "v1"}
	d = step(m, tNow, back, running(onV1("b")), running(onV1("c")))
	if d.Intents != nil || d.RollbackStarted || d.Progress.RollingBack != 1 || d.Status.NodesByUpgradeState[kmmv1beta1.RollingBack] != 1 {
		t.Fatalf("intents %v, started %v, progress %+v: want a RollingBack and nothing else", d.Intents, d.RollbackStarted, d.Progress)
	}
	if d.Status.Nodes[0].State != kmmv1beta1.RollingBack {
		t.Fatalf("rows %+v: want a listed RollingBack", d.Status.Nodes)
	}
	// Back on v1: RolledBack, still paused.
	d = step(m, tNow, running(onV1("a")), running(onV1("b")), running(onV1("c")))
	if d.Progress.RolledBack != 1 || d.Intents != nil || d.Status.Paused == nil {
		t.Fatalf("progress %+v, intents %v, paused %v: want RolledBack and paused", d.Progress, d.Intents, d.Status.Paused)
	}
	// A resume ends the rollback: a is pending again and starts first.
	m.Annotations = map[string]string{kmmv1beta1.RolloutResumeAnnotation: "1"}
	d = step(m, tNow, running(onV1("a")), running(onV1("b")), running(onV1("c")))
	if d.Status.Rollback != nil || !reflect.DeepEqual(d.Intents, to("v2", "a")) {
		t.Fatalf("rollback %+v, intents %v after the resume: want it over and a started again", d.Status.Rollback, d.Intents)
	}
}

func TestRollbackNeedsThePolicyAndAConfig(t *testing.T) {
	m := rollbackModule()
	m.Spec.UpgradePolicy.RollbackFailed = false
	step(m, tNow, running(onV1("a")), running(onV1("b")))
	if d := step(m, tNow, running(backingOff("a")), running(onV1("b"))); d.Status.Rollback != nil || d.Intents != nil {
		t.Fatalf("without rollbackFailed: rollback %+v, intents %v, want none", d.Status.Rollback, d.Intents)
	}
	m = rollbackModule()
	step(m, tNow, running(onV1("a")), running(onV1("b")))
	d := step(m, tNow, withKernel(backingOff("a"), "6.9-other"), running(onV1("b")))
	if d.Status.Rollback != nil || d.Intents != nil || !strings.Contains(d.Status.Nodes[0].Message, "not rolled back") {
		t.Fatalf("a kernel without a previous config: rollback %+v, intents %v, row %+v; want it left failed and said so", d.Status.Rollback, d.Intents, d.Status.Nodes[0])
	}
	// Not paused (no budget reached): no rollback.
	m = rollbackModule()
	m.Spec.UpgradePolicy.MaxFailed = intOf(2)
	step(m, tNow, running(onV1("a")), running(onV1("b")))
	if d := step(m, tNow, running(backingOff("a")), running(onV1("b"))); d.Status.Rollback != nil {
		t.Fatalf("a running rollout rolled back: %+v", d.Status.Rollback)
	}
}

func TestUndo(t *testing.T) {
	m := rollbackModule()
	m.Spec.UpgradePolicy.MaxUnavailable = intOf(1)
	ns := []RolloutNode{running(onV1("a")), running(onV2("b")), running(onV2("c")), running(upgrading("d", kmmv1beta1.StateLoading, ""))}
	step(m, tNow, ns...)
	m.Annotations = map[string]string{kmmv1beta1.RolloutUndoAnnotation: "t1"}
	d := step(m, tNow, ns...)
	if rb := d.Status.Rollback; rb == nil || rb.Reason != kmmv1beta1.ReasonRollbackUndo || rb.Version != "v1" || d.Status.ObservedUndo != "t1" || !d.RollbackStarted {
		t.Fatalf("rollback %+v (observed %q): want an undo to v1", rb, d.Status.ObservedUndo)
	}
	// d (in progress) goes back at once; b and c (upgraded) within maxUnavailable, which d uses up.
	if !reflect.DeepEqual(d.Intents, to("v1", "d")) {
		t.Fatalf("intents %v, want d back at once and no upgraded node beyond maxUnavailable", d.Intents)
	}
	ns[3] = running(onV1("d"))
	since := d.Status.Rollback.Since
	d = step(m, tNow.Add(time.Minute), ns...)
	if !reflect.DeepEqual(d.Intents, to("v1", "b")) || d.Progress.RolledBack != 2 {
		t.Fatalf("intents %v, progress %+v: want b next, a and d RolledBack", d.Intents, d.Progress)
	}
	// The same annotation again starts nothing new; a resume ends the undo.
	if !d.Status.Rollback.Since.Equal(&since) || d.RollbackStarted {
		t.Fatal("the undo restarted")
	}
	m.Annotations[kmmv1beta1.RolloutResumeAnnotation] = "r1"
	if d = step(m, tNow, ns...); d.Status.Rollback != nil {
		t.Fatalf("rollback %+v after a resume, want none", d.Status.Rollback)
	}
}

func TestUndoWithoutPreviousIsRefused(t *testing.T) {
	m := rolloutModule("v2", auto(intOf(1)))
	m.Annotations = map[string]string{kmmv1beta1.RolloutUndoAnnotation: "t1"}
	d := step(m, tNow, running(onV2("a")))
	if d.UndoRefused == "" || d.Status.Rollback != nil || d.Status.ObservedUndo != "t1" {
		t.Fatalf("refused %q, rollback %+v, observed %q: want refused once and observed", d.UndoRefused, d.Status.Rollback, d.Status.ObservedUndo)
	}
	if d = step(m, tNow, running(onV2("a"))); d.UndoRefused != "" {
		t.Fatal("the same undo was refused twice (two Events)")
	}
}

func TestOldestPairState(t *testing.T) {
	notStarted := since(upgrading("b", kmmv1beta1.StateLoaded, "v1"), 48*time.Hour) // its pair has not started: aside
	draining := since(upgrading("c", kmmv1beta1.StateDevicePluginDraining, "v1"), 2*time.Hour)
	later := since(upgrading("d", kmmv1beta1.StateUnloading, "v1"), time.Hour)
	d := DecideRollout(RolloutInput{Module: rolloutModule("v2", auto(intOf(4))), Now: tNow,
		Nodes: []RolloutNode{backingOff("a"), notStarted, draining, later}})
	want := map[kmmv1beta1.UpgradeState]time.Time{kmmv1beta1.UpgradeFailed: tNow.Add(-time.Minute), kmmv1beta1.Upgrading: tNow.Add(-2 * time.Hour)}
	if !reflect.DeepEqual(d.OldestSince, want) {
		t.Fatalf("oldest %v, want %v", d.OldestSince, want)
	}
}
