package v1beta1

import "testing"

func TestLabelClassification(t *testing.T) {
	state := []string{ReadyLabel("ns", "a"), VersionReadyLabel("ns", "a.b")}
	notState := []string{ModuleVersionLabel("ns", "a"), WorkerPodVersionLabel("ns", "a"), UpgradeSkipLabel("ns", "a"), "kubernetes.io/hostname", "other.io/x.ready"}
	for _, k := range state {
		if !IsStateLabel(k) {
			t.Errorf("IsStateLabel(%q) = false", k)
		}
	}
	for _, k := range notState {
		if IsStateLabel(k) {
			t.Errorf("IsStateLabel(%q) = true", k)
		}
	}
	for key, want := range map[string]string{
		WorkerPodVersionLabel("ns", "a.b"):                     "ns/a.b",
		DevicePluginVersionLabel("ns", "c"):                    "ns/c",
		ModuleVersionLabel("ns", "c"):                          "",
		"beta.kmm.node.kubernetes.io/version-worker-pod.nodot": "",
	} {
		got, ok := ParseInternalVersionLabel(key)
		if got != want || ok != (want != "") {
			t.Errorf("ParseInternalVersionLabel(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}
