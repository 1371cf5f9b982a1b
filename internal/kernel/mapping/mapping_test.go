package mapping

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func testModule(version string) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "nic"},
		Spec: kmmv1beta1.ModuleSpec{
			Selector:        map[string]string{"role": "worker"},
			ImageRepoSecret: &corev1.LocalObjectReference{Name: "pull"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Version:        version,
				ContainerImage: "reg.example.com/$MOD_NAMESPACE/$MOD_NAME:$KERNEL_FULL_VERSION",
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "nic"},
				KernelMappings: []kmmv1beta1.KernelMapping{
					{Literal: "5.14.0-1.el9.x86_64", ContainerImage: "reg.example.com/nic:literal"},
					{Regexp: `^6\.1\..*-cloud-amd64$`, RegistryTLS: &kmmv1beta1.TLSOptions{Insecure: true}, InTreeModulesToRemove: []string{"old_nic"}},
					{VersionRange: ">=6.8 <7", ContainerImage: "reg.example.com/nic:$KERNEL_XYZ"},
				},
			}},
		},
	}
}

func TestSelects(t *testing.T) {
	m := testModule("")
	if !Selects(m, map[string]string{"role": "worker", "zone": "a"}) {
		t.Error("a node carrying the selector's labels is not selected")
	}
	if Selects(m, map[string]string{"role": "infra"}) {
		t.Error("a node with another role is selected")
	}
	m.Spec.Selector = nil
	if Selects(m, map[string]string{"role": "worker"}) {
		t.Error("an empty selector selects a node")
	}
}

// TestResolve covers each kind of mapping and each reason Resolve gives.
func TestResolve(t *testing.T) {
	pluginOnly := testModule("")
	pluginOnly.Spec.ModuleLoader = nil
	invalid := testModule("")
	invalid.Spec.ModuleLoader.Container.KernelMappings = []kmmv1beta1.KernelMapping{{Regexp: "(", ContainerImage: "r/x:y"}}
	cases := []struct {
		name       string
		module     *kmmv1beta1.Module
		kernel     string
		wantReason string
		wantImage  string
	}{
		{"literal", testModule(""), "5.14.0-1.el9.x86_64", "", "reg.example.com/nic:literal"},
		{"regexp, the container's image templated", testModule(""), "6.1.0-56-cloud-amd64", "", "reg.example.com/drivers/nic:6.1.0-56-cloud-amd64"},
		{"versionRange, trailing + ignored", testModule(""), "6.10.3-100+", "", "reg.example.com/nic:6.10.3"},
		{"no mapping for the kernel", testModule(""), "4.18.0-1.el8.x86_64", ReasonNoKernelMapping, ""},
		{"unparsable kernel", testModule(""), "garbage", ReasonInvalidKernel, ""},
		{"a mapping that does not compile", invalid, "6.1.0", ReasonInvalidSpec, ""},
		{"no module loader", pluginOnly, "6.1.0", ReasonDevicePluginOnly, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, reason, err := Resolve(tc.module, tc.kernel)
			if reason != tc.wantReason || (err != nil) != (tc.wantReason != "") {
				t.Fatalf("Resolve = %q, %v; want reason %q", reason, err, tc.wantReason)
			}
			if cfg.ContainerImage != tc.wantImage {
				t.Fatalf("image = %q, want %q", cfg.ContainerImage, tc.wantImage)
			}
		})
	}
}

func TestResolveAppliesMappingOverrides(t *testing.T) {
	m := testModule("v1")
	m.Spec.ModuleLoader.Container.InTreeModuleToRemove = "legacy"
	c, _, err := Resolve(m, "6.1.0-56-cloud-amd64")
	if err != nil {
		t.Fatal(err)
	}
	if !c.RegistryTLS.Insecure || len(c.InTreeModulesToRemove) != 1 || c.InTreeModulesToRemove[0] != "old_nic" ||
		c.Modprobe.DirName != "/opt" || c.Version != "v1" || c.KernelVersion != "6.1.0-56-cloud-amd64" {
		t.Fatalf("config = %+v", c)
	}
	c, _, err = Resolve(m, "5.14.0-1.el9.x86_64")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.InTreeModulesToRemove; len(got) != 1 || got[0] != "legacy" || c.RegistryTLS.Insecure {
		t.Fatalf("container defaults not used for a mapping without overrides: %+v", c)
	}
}

func TestResolveReportsAnInvalidMapping(t *testing.T) {
	m := testModule("")
	m.Spec.ModuleLoader.Container.KernelMappings = []kmmv1beta1.KernelMapping{{Regexp: "(", ContainerImage: "r/x:y"}}
	_, reason, err := Resolve(m, "6.1.0")
	if err == nil || reason != ReasonInvalidSpec || !strings.Contains(err.Error(), "kernelMappings[0]") {
		t.Fatalf("Resolve = %v/%v, want InvalidSpec naming kernelMappings[0]", reason, err)
	}
}

func TestCompilePatternCachesAndBounds(t *testing.T) {
	a, err := CompilePattern(`^6\.1\..*$`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := CompilePattern(`^6\.1\..*$`)
	if a != b {
		t.Error("the same pattern was compiled twice")
	}
	if _, err := CompilePattern(`(`); err == nil {
		t.Error("an invalid pattern compiled")
	}
	for i := range 2 * maxCachedPatterns {
		if _, err := CompilePattern(fmt.Sprintf("^n%d$", i)); err != nil {
			t.Fatal(err)
		}
	}
	patterns.Lock()
	n := len(patterns.compiled)
	patterns.Unlock()
	if n > maxCachedPatterns {
		t.Errorf("%d patterns cached, want at most %d", n, maxCachedPatterns)
	}
}
