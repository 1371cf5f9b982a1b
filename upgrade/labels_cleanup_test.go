package upgrade

import (
	"slices"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func TestStaleInternalLabels(t *testing.T) {
	labels := map[string]string{
		kmmv1beta1.WorkerPodVersionLabel("ns", "gone"):     "v1",
		kmmv1beta1.DevicePluginVersionLabel("ns", "gone"):  "v1",
		kmmv1beta1.WorkerPodVersionLabel("ns", "active"):   "v1",
		kmmv1beta1.WorkerPodVersionLabel("ns", "draining"): "v1",
		kmmv1beta1.WorkerPodVersionLabel("ns", "a.b"):      "v2", // a Module name with a dot
		kmmv1beta1.ModuleVersionLabel("ns", "gone"):        "v1", // the user's label: never touched
		"kubernetes.io/hostname":                           "n0",
	}
	active := map[string]bool{"ns/active": true}
	pairs := map[string]bool{"ns/draining": true} // deleted, but its unload is not done yet
	got := StaleInternalLabels(labels, active, pairs)
	want := []string{kmmv1beta1.DevicePluginVersionLabel("ns", "gone"), kmmv1beta1.WorkerPodVersionLabel("ns", "a.b"), kmmv1beta1.WorkerPodVersionLabel("ns", "gone")}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("stale labels = %v, want %v", got, want)
	}
}
