package fsm

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// checkLabelKeys fails when a valid (namespace, name) within the length budget yields an invalid
// label key.
func checkLabelKeys(t *testing.T, ns, name string) {
	t.Helper()
	if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 ||
		len(ns)+len(name) > kmmv1beta1.MaxVersionedNameLength {
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
	name := strings.Repeat("m", kmmv1beta1.MaxVersionedNameLength-len(ns))
	checkLabelKeys(t, ns, name)
	if got := kmmv1beta1.WorkerPodVersionLabel("ns", "m"); got != "beta.kmm.node.kubernetes.io/version-worker-pod.ns.m" {
		t.Fatalf("WorkerPodVersionLabel = %s", got)
	}
	if got := kmmv1beta1.ReadyLabel("ns", "m"); got != "kmm.node.kubernetes.io/ns.m.ready" {
		t.Fatalf("ReadyLabel = %s", got)
	}
}
