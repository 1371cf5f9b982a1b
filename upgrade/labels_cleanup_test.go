package upgrade

import (
	"slices"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func TestStaleInternalLabels(t *testing.T) {
	labels := map[string]string{
		kmmv1beta1.WorkerPodVersionLabel("ns", "gone"):              "v1",
		kmmv1beta1.DevicePluginVersionLabel("ns", "gone"):           "v1",
		kmmv1beta1.WorkerPodVersionLabel("ns", "active"):            "v1",
		kmmv1beta1.WorkerPodVersionLabel("ns", "draining"):          "v1",
		kmmv1beta1.WorkerPodVersionLabel("ns", "a.b"):               "v2", // a Module name with a dot
		kmmv1beta1.ModuleVersionLabel("ns", "gone"):                 "v1", // the user's label: never touched
		"kubernetes.io/hostname":                                    "n0",
		"beta.kmm.node.kubernetes.io/version-device-plugin.ns.gone": "v1", // the legacy name
	}
	active := map[string]bool{"ns/active": true}
	pairs := map[string]bool{"ns/draining": true} // deleted, but its unload is not done yet
	got := StaleInternalLabels(labels, active, pairs)
	want := []string{"beta.kmm.node.kubernetes.io/version-device-plugin.ns.gone", kmmv1beta1.DevicePluginVersionLabel("ns", "gone"), kmmv1beta1.WorkerPodVersionLabel("ns", "a.b"), kmmv1beta1.WorkerPodVersionLabel("ns", "gone")}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("stale labels = %v, want %v", got, want)
	}
}

// TestSwitchedLabels: the switch from the legacy version-device-plugin label. The new label comes
// first (with the legacy value), the legacy one follows it while something selects on it and goes
// after; the ordered upgrade's steps read the legacy value as the device-plugin label.
func TestSwitchedLabels(t *testing.T) {
	loadedV1 := Observed{Loaded: true, LoadedVersion: "v1", DevicePluginPodOnNode: true}
	cases := []struct {
		name                    string
		l                       NodeLabels
		legacy                  string
		o                       Observed
		needed                  bool
		wantCurrent, wantLegacy string
	}{
		{"taken over: only the legacy label, a DaemonSet selects it: add the new one, keep the legacy one",
			NodeLabels{Target: "v1", WorkerPod: "v1"}, "v1", loadedV1, true, "v1", "v1"},
		{"both, nothing selects the legacy one any more: drop it",
			NodeLabels{Target: "v1", WorkerPod: "v1", DevicePlugin: "v1"}, "v1", loadedV1, false, "v1", ""},
		{"only the legacy label, nothing selects it: the new one still comes",
			NodeLabels{Target: "v1", WorkerPod: "v1"}, "v1", loadedV1, false, "v1", ""},
		{"an upgrade to v2 taken over mid-way: the device plugin leaves under both names (step 2)",
			NodeLabels{Target: "v2", WorkerPod: "v1"}, "v1", loadedV1, true, "", ""},
		{"step 5 while a DaemonSet still selects the legacy label: both names get v2",
			NodeLabels{Target: "v2", WorkerPod: "v2"}, "", Observed{Loaded: true, LoadedVersion: "v2"}, true, "v2", "v2"},
		{"no legacy label anywhere: NextLabels alone",
			NodeLabels{Target: "v2", WorkerPod: "v2"}, "", Observed{Loaded: true, LoadedVersion: "v2"}, false, "v2", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			current, legacy := SwitchedLabels(tc.l, tc.legacy, tc.o, tc.needed)
			if current != tc.wantCurrent || legacy != tc.wantLegacy {
				t.Errorf("SwitchedLabels = %q, %q; want %q, %q", current, legacy, tc.wantCurrent, tc.wantLegacy)
			}
		})
	}
}
