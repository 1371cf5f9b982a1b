package v1beta1

import "testing"

func TestParseInternalVersionLabel(t *testing.T) {
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
