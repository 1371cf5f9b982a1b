package preflight

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func testModule() *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "nic"},
		Spec: kmmv1beta1.ModuleSpec{
			Selector:        map[string]string{"role": "worker"},
			ImageRepoSecret: &corev1.LocalObjectReference{Name: "pull"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				ContainerImage: "reg.example.com/$MOD_NAME:$KERNEL_FULL_VERSION",
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "nic"},
				KernelMappings: []kmmv1beta1.KernelMapping{
					{Literal: "5.14.0-1.el9.x86_64", ContainerImage: "reg.example.com/nic:literal"},
					{Regexp: `^6\.1\..*-cloud-amd64$`, RegistryTLS: &kmmv1beta1.TLSOptions{Insecure: true}},
				},
			}},
		},
	}
}

// TestDecide covers each reason: the mapping comes from mapping.Resolve (literal, then regexp with
// the default image expanded), and each registry outcome maps to its reason.
func TestDecide(t *testing.T) {
	pluginOnly := testModule()
	pluginOnly.Spec.ModuleLoader = nil
	badRegexp := testModule()
	badRegexp.Spec.ModuleLoader.Container.KernelMappings[0] = kmmv1beta1.KernelMapping{Regexp: "("}
	cases := []struct {
		name        string
		module      *kmmv1beta1.Module
		kernel      string
		check       CheckResult
		wantReason  string
		wantOK      bool
		wantImage   string
		wantNotDone bool
	}{
		{"literal mapping, image found", testModule(), "5.14.0-1.el9.x86_64", CheckResult{Outcome: Found},
			kmmv1beta1.PreflightReasonSuccess, true, "reg.example.com/nic:literal", false},
		{"regexp mapping with the default image expanded, found", testModule(), "6.1.0-57-cloud-amd64", CheckResult{Outcome: Found},
			kmmv1beta1.PreflightReasonSuccess, true, "reg.example.com/nic:6.1.0-57-cloud-amd64", false},
		{"no mapping matches: no check needed", testModule(), "6.8.0-1-generic", CheckResult{Outcome: Found},
			kmmv1beta1.PreflightReasonNoMapping, false, "", false},
		{"image missing", testModule(), "5.14.0-1.el9.x86_64", CheckResult{Outcome: NotFound},
			kmmv1beta1.PreflightReasonImageMissing, false, "reg.example.com/nic:literal", false},
		{"credentials refused", testModule(), "5.14.0-1.el9.x86_64", CheckResult{Outcome: Denied},
			kmmv1beta1.PreflightReasonUnauthorized, false, "reg.example.com/nic:literal", false},
		{"pull secret the operator may not read: retried", testModule(), "5.14.0-1.el9.x86_64", CheckResult{Outcome: SecretForbidden},
			kmmv1beta1.PreflightReasonSecretForbidden, false, "reg.example.com/nic:literal", true},
		{"registry unreachable: retried", testModule(), "5.14.0-1.el9.x86_64", CheckResult{Outcome: Unreachable},
			kmmv1beta1.PreflightReasonRegistryUnreachable, false, "reg.example.com/nic:literal", true},
		{"kernel that is no kernel version", testModule(), "not/a/kernel", CheckResult{Outcome: Found},
			kmmv1beta1.PreflightReasonInvalidKernel, false, "", false},
		{"a mapping that cannot be evaluated", badRegexp, "5.14.0-1.el9.x86_64", CheckResult{Outcome: Found},
			kmmv1beta1.PreflightReasonInvalidSpec, false, "", false},
		{"device-plugin-only Module: nothing to load", pluginOnly, "6.8.0-1-generic", CheckResult{},
			kmmv1beta1.PreflightReasonSuccess, true, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := Decide(c.module, c.kernel, c.check)
			if v.Reason != c.wantReason || v.Verified != c.wantOK || v.Image != c.wantImage || v.Final == c.wantNotDone {
				t.Fatalf("Decide = %+v, want reason %s, verified %v, image %q, final %v", v, c.wantReason, c.wantOK, c.wantImage, !c.wantNotDone)
			}
			if v.Key() != "drivers/nic" || v.Message == "" {
				t.Fatalf("verdict without key or message: %+v", v)
			}
		})
	}
}

// TestPlanCarriesTheWorkerSettings: the check uses the mapping's registryTLS and the Module's pull
// secret, as the worker's pull would.
func TestPlanCarriesTheWorkerSettings(t *testing.T) {
	target, v := Plan(testModule(), "6.1.0-57-cloud-amd64")
	if v != nil {
		t.Fatalf("Plan decided without a check: %+v", v)
	}
	if !target.RegistryTLS.Insecure || target.PullSecret != "pull" || target.Image != "reg.example.com/nic:6.1.0-57-cloud-amd64" {
		t.Fatalf("target %+v", target)
	}
}

// TestPlatforms: only the nodes the selector matches count, each platform once.
func TestPlatforms(t *testing.T) {
	node := func(name, arch string, labels map[string]string) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		n.Status.NodeInfo.OperatingSystem, n.Status.NodeInfo.Architecture = "linux", arch
		return n
	}
	worker := map[string]string{"role": "worker"}
	nodes := []corev1.Node{node("a", "amd64", worker), node("b", "arm64", worker), node("c", "amd64", worker),
		node("d", "s390x", map[string]string{"role": "infra"}), node("e", "", worker)}
	got := Platforms(testModule(), nodes)
	if len(got) != 2 || got[0].Architecture != "amd64" || got[1].Architecture != "arm64" {
		t.Fatalf("Platforms = %+v, want linux/amd64 and linux/arm64", got)
	}
}
