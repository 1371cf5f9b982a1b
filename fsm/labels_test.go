package fsm

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/util/validation"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// checkLabelKeys fails when a valid (namespace, name) within the length budget yields an invalid
// label key.
func checkLabelKeys(t *testing.T, ns, name string) {
	t.Helper()
	if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 ||
		len(ns)+len(name) > kmmv1beta1.MaxNameLength {
		return // admission rejects these Modules
	}
	for _, key := range []string{kmmv1beta1.ReadyLabel(ns, name), kmmv1beta1.VersionReadyLabel(ns, name), kmmv1beta1.ModuleVersionLabel(ns, name),
		kmmv1beta1.WorkerPodVersionLabel(ns, name), kmmv1beta1.DevicePluginVersionLabel(ns, name)} {
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			t.Fatalf("label key %q is invalid: %s", key, strings.Join(errs, "; "))
		}
	}
}

func TestLabelKeysAtTheLengthBudget(t *testing.T) {
	ns := strings.Repeat("n", 19)
	name := strings.Repeat("m", kmmv1beta1.MaxNameLength-len(ns))
	checkLabelKeys(t, ns, name)
	if got := kmmv1beta1.WorkerPodVersionLabel("ns", "m"); got != "beta.kmm.node.kubernetes.io/version-worker-pod.ns.m" {
		t.Fatalf("WorkerPodVersionLabel = %s", got)
	}
	if got := kmmv1beta1.ReadyLabel("ns", "m"); got != "kmm.node.kubernetes.io/ns.m.ready" {
		t.Fatalf("ReadyLabel = %s", got)
	}
}

// TestReadyLabels: a pair's ready and version.ready labels as its state asks for them. The ready
// label stays through a reload of a Module without a device plugin (its old special case: the
// "reload, no device plugin" case fails without it); with a device plugin it goes, so that the
// plugin leaves the node before the module is replaced.
func TestReadyLabels(t *testing.T) {
	e1, e1b, v1 := entry(k1, "r/m:v1", ""), entry(k1, "r/m:v1b", ""), entry(k1, "r/m:v1", "v1")
	withDP := facts(e1b, loaded(Loading, e1), readyNode(k1))
	withDP.DevicePluginConfigured = true
	fresh := loaded(Loading, e1)
	fresh.Config = nil
	cases := []struct {
		name    string
		f       Facts
		ready   bool
		version string
	}{
		{"loaded, no version", facts(e1, loaded(Loaded, e1), readyNode(k1)), true, ""},
		{"loaded, versioned: version.ready names the loaded version", facts(v1, loaded(Loaded, v1), readyNode(k1)), true, "v1"},
		{"reload, no device plugin: the ready label stays", facts(e1b, loaded(Loading, e1), readyNode(k1)), true, ""},
		{"reload, device plugin configured: the ready label goes", withDP, false, ""},
		{"first load: not yet", facts(e1, fresh, readyNode(k1)), false, ""},
		{"unloading", facts(nil, loaded(Unloading, e1), readyNode(k1)), false, ""},
		{"device plugin draining", facts(e1b, loaded(DevicePluginDraining, e1), readyNode(k1)), false, ""},
		{"load back-off", facts(e1, loaded(LoadBackOff, e1), readyNode(k1)), false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ready, version := readyLabels(&tc.f)
			if ready != tc.ready || version != tc.version {
				t.Errorf("readyLabels = (%v, %q), want (%v, %q)", ready, version, tc.ready, tc.version)
			}
		})
	}
}

// TestNodeLabels: the labels kmm sets and removes on a node. The cases named "special case" fail
// when the rule they name is dropped: labels upstream KMM set for a record not yet decided on stay,
// an adopted pair keeps upstream's device-plugin-ready label while kmm's device plugin has no pod
// on the node, and only the exact keys of known Modules are kmm's.
func TestNodeLabels(t *testing.T) {
	const m, other = "ns/m", "ns/other"
	ready, versionReady, dpReady := kmmv1beta1.ReadyLabel("ns", "m"), kmmv1beta1.VersionReadyLabel("ns", "m"), kmmv1beta1.DevicePluginReadyLabel("ns", "m")
	loadedV1 := &Result{Status: &kmmv1beta1.NodeModuleStatus{State: Loaded}, Plan: Plan{Ready: true, VersionReady: "v1"}}
	loadedPlain := &Result{Status: &kmmv1beta1.NodeModuleStatus{State: Loaded}, Plan: Plan{Ready: true}}
	unloading := &Result{Status: &kmmv1beta1.NodeModuleStatus{State: Unloading}}
	adopted := &Result{Status: &kmmv1beta1.NodeModuleStatus{State: Loaded, Reason: string(Adopted)}, Plan: Plan{Ready: true}}
	undecided := &Result{Status: &kmmv1beta1.NodeModuleStatus{}, Plan: Plan{Waiting: "waiting for upstream KMM's worker pod of this module to finish"}}
	userSkip := kmmv1beta1.UpgradeSkipLabel("ns", "gpu.ready")
	cases := []struct {
		name   string
		labels map[string]string
		mods   []string
		pairs  []LabelPair
		want   NodeLabelSet
	}{
		{"loaded, versioned: ready and version.ready", nil, []string{m},
			[]LabelPair{{Key: m, Result: loadedV1}},
			NodeLabelSet{Set: map[string]string{ready: "", versionReady: "v1"}}},
		{"labels already right: set as they are", map[string]string{ready: "", versionReady: "v1"}, []string{m},
			[]LabelPair{{Key: m, Result: loadedV1}},
			NodeLabelSet{Set: map[string]string{ready: "", versionReady: "v1"}}},
		{"unloading: all three go", map[string]string{ready: "", versionReady: "v1", dpReady: ""}, []string{m},
			[]LabelPair{{Key: m, Result: unloading, DevicePluginRunning: true, DevicePluginReady: true}},
			NodeLabelSet{Set: map[string]string{}, Remove: []string{dpReady, ready, versionReady}}},
		{"device plugin pod Ready: device-plugin-ready", nil, []string{m},
			[]LabelPair{{Key: m, Result: loadedPlain, DevicePluginRunning: true, DevicePluginReady: true}},
			NodeLabelSet{Set: map[string]string{ready: "", dpReady: ""}}},
		{"device plugin pod not Ready: device-plugin-ready goes", map[string]string{ready: "", dpReady: ""}, []string{m},
			[]LabelPair{{Key: m, Result: loadedPlain, DevicePluginRunning: true}},
			NodeLabelSet{Set: map[string]string{ready: ""}, Remove: []string{dpReady}}},
		{"special case: adopted, kmm's device plugin not on the node yet: upstream's device-plugin-ready stays",
			map[string]string{ready: "", dpReady: ""}, []string{m},
			[]LabelPair{{Key: m, Result: adopted}},
			NodeLabelSet{Set: map[string]string{ready: "", dpReady: ""}}},
		{"adopted, kmm's device plugin pod there but not Ready: device-plugin-ready goes",
			map[string]string{ready: "", dpReady: ""}, []string{m},
			[]LabelPair{{Key: m, Result: adopted, DevicePluginRunning: true}},
			NodeLabelSet{Set: map[string]string{ready: ""}, Remove: []string{dpReady}}},
		{"adopted without upstream's label: none set", nil, []string{m},
			[]LabelPair{{Key: m, Result: adopted}},
			NodeLabelSet{Set: map[string]string{ready: ""}}},
		{"special case: upstream's record not decided on: its labels stay as upstream set them",
			map[string]string{ready: "", versionReady: "v1", dpReady: ""}, []string{m},
			[]LabelPair{{Key: m, Result: undecided}},
			NodeLabelSet{Set: map[string]string{}}},
		{"special case: only the exact keys of known Modules are kmm's",
			map[string]string{
				kmmv1beta1.ReadyLabel("ns", "gpu.ready"):        "",
				kmmv1beta1.VersionReadyLabel("ns", "gpu.ready"): "v1",
				kmmv1beta1.ReadyLabel("ns", "gone"):             "",
				kmmv1beta1.ReadyLabel("other", "unknown"):       "",
				userSkip: "",
				kmmv1beta1.ModuleVersionLabel("ns", "gpu.ready"): "v1",
				"example.com/x.ready":                            "",
			},
			[]string{"ns/gpu.ready"},
			[]LabelPair{{Key: "ns/gone", Result: &Result{}}},
			NodeLabelSet{Set: map[string]string{}, Remove: []string{kmmv1beta1.ReadyLabel("ns", "gone"), kmmv1beta1.ReadyLabel("ns", "gpu.ready"), kmmv1beta1.VersionReadyLabel("ns", "gpu.ready")}}},
		{"two pairs: each its own", map[string]string{kmmv1beta1.ReadyLabel("ns", "other"): ""}, []string{m, other},
			[]LabelPair{{Key: m, Result: loadedPlain}, {Key: other, Result: unloading}},
			NodeLabelSet{Set: map[string]string{ready: ""}, Remove: []string{kmmv1beta1.ReadyLabel("ns", "other")}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mods := map[string]bool{}
			for _, k := range tc.mods {
				mods[k] = true
			}
			got := NodeLabels(LabelFacts{Labels: tc.labels, Modules: mods, Pairs: tc.pairs})
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("NodeLabels (-want +got):\n%s", diff)
			}
		})
	}
}
