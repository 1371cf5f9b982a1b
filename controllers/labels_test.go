package controllers

import (
	"slices"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestOwnedStateLabelsParseExactly: only the ready and version.ready labels kmm derives for a known
// Module are kmm's. A user's label that merely ends in ".ready" — such as the upgrade-skip label of
// a Module named "gpu.ready" — is never taken for one (it used to be removed from the node).
func TestOwnedStateLabelsParseExactly(t *testing.T) {
	userSkip := kmmv1beta1.UpgradeSkipLabel("ns", "gpu.ready")
	nodeLabels := map[string]string{
		kmmv1beta1.ReadyLabel("ns", "gpu.ready"):        "",
		kmmv1beta1.VersionReadyLabel("ns", "gpu.ready"): "v1",
		kmmv1beta1.ReadyLabel("ns", "gone"):             "",
		kmmv1beta1.ReadyLabel("other", "unknown"):       "",
		userSkip: "",
		kmmv1beta1.ModuleVersionLabel("ns", "gpu.ready"): "v1",
		"example.com/x.ready":                            "",
	}
	got := ownedStateLabels(nodeLabels, map[string]bool{"ns/gpu.ready": true}, []string{"ns/gone"})
	slices.Sort(got)
	want := []string{kmmv1beta1.ReadyLabel("ns", "gone"), kmmv1beta1.ReadyLabel("ns", "gpu.ready"), kmmv1beta1.VersionReadyLabel("ns", "gpu.ready")}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("owned state labels = %v, want %v (the user's %s and labels of unknown Modules stay)", got, want, userSkip)
	}
}
