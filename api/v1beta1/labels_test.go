package v1beta1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParseInternalVersionLabel(t *testing.T) {
	for key, want := range map[string]string{
		WorkerPodVersionLabel("ns", "a.b"):                       "ns/a.b",
		DevicePluginVersionLabel("ns", "c"):                      "ns/c",
		"beta.kmm.node.kubernetes.io/version-device-plugin.ns.d": "ns/d",
		ModuleVersionLabel("ns", "c"):                            "",
		"beta.kmm.node.kubernetes.io/version-worker-pod.nodot":   "",
	} {
		got, ok := ParseInternalVersionLabel(key)
		if got != want || ok != (want != "") {
			t.Errorf("ParseInternalVersionLabel(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}

// TestVersionLabelsAsUpstream pins upstream KMM's current names and its budget: every key kmm derives
// for a Module of MaxNameLength is a valid label key, the legacy name is not (no node can carry it).
func TestVersionLabelsAsUpstream(t *testing.T) {
	if got, want := DevicePluginVersionLabel("ns", "m"), "beta.kmm.node.kubernetes.io/version-schedule-pod.ns.m"; got != want {
		t.Errorf("DevicePluginVersionLabel = %q, want upstream's %q", got, want)
	}
	if got, ok := LegacyDevicePluginVersionLabel("ns", "m"); got != "beta.kmm.node.kubernetes.io/version-device-plugin.ns.m" || !ok {
		t.Errorf("LegacyDevicePluginVersionLabel = %q, %v", got, ok)
	}
	ns, name := strings.Repeat("n", 20), strings.Repeat("m", MaxNameLength-20)
	keys := append(StateLabels(ns, name), ModuleVersionLabel(ns, name), WorkerPodVersionLabel(ns, name),
		DevicePluginVersionLabel(ns, name), UpgradeSkipLabel(ns, name))
	for _, k := range keys {
		if errs := validation.IsQualifiedName(k); len(errs) != 0 {
			t.Errorf("%s (%d characters of namespace+name): %v", k, MaxNameLength, errs)
		}
	}
	if k, ok := LegacyDevicePluginVersionLabel(ns, name); ok || len(validation.IsQualifiedName(k)) == 0 {
		t.Errorf("legacy key %s: ok %v, but it is not a valid key at %d characters", k, ok, MaxNameLength)
	}
	if k, ok := LegacyDevicePluginVersionLabel(ns, name[1:]); !ok || len(validation.IsQualifiedName(k)) != 0 {
		t.Errorf("legacy key %s: ok %v, want a valid key at %d characters", k, ok, MaxNameLength-1)
	}
}
