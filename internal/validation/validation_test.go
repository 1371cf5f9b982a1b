package validation_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/validation"
)

// validModule passes every rule; each case below breaks (or exercises) one.
func validModule() *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "nic"},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"node-role.kubernetes.io/worker": ""},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				ContainerImage: "reg.example.com/$MOD_NAME:$KERNEL_FULL_VERSION",
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "nic"},
				KernelMappings: []kmmv1beta1.KernelMapping{{Regexp: `^.+\.el9\.x86_64$`}},
			}},
		},
	}
}

func container(m *kmmv1beta1.Module) *kmmv1beta1.ModuleLoaderContainerSpec {
	return &m.Spec.ModuleLoader.Container
}

// check fails unless errs is empty (wantField "") or holds an error on wantField whose text says
// wantMsg.
func check(t *testing.T, errs field.ErrorList, wantField, wantMsg string) {
	t.Helper()
	if wantField == "" {
		if len(errs) != 0 {
			t.Fatalf("want no error, got %v", errs.ToAggregate())
		}
		return
	}
	for _, e := range errs {
		if e.Field == wantField && strings.Contains(e.Error(), wantMsg) {
			return
		}
	}
	t.Fatalf("want an error on %s saying %q, got %v", wantField, wantMsg, errs.ToAggregate())
}

func TestModule(t *testing.T) {
	const (
		mappings = "spec.moduleLoader.container.kernelMappings"
		modprobe = "spec.moduleLoader.container.modprobe"
	)
	cases := []struct {
		name      string
		mutate    func(m *kmmv1beta1.Module)
		wantField string
		wantMsg   string
	}{
		{"valid", func(*kmmv1beta1.Module) {}, "", ""},

		{"selector: empty", func(m *kmmv1beta1.Module) { m.Spec.Selector = nil }, "spec.selector", "selector must not be empty"},
		{"selector: invalid label key", func(m *kmmv1beta1.Module) { m.Spec.Selector = map[string]string{"bad key": ""} },
			"spec.selector[bad key]", "not a valid label key"},
		{"selector: invalid label value", func(m *kmmv1beta1.Module) { m.Spec.Selector = map[string]string{"role": "a b"} },
			"spec.selector[role]", "not a valid label value"},

		{"name budget: 41 bytes", func(m *kmmv1beta1.Module) { m.Namespace, m.Name = strings.Repeat("n", 20), strings.Repeat("m", 21) }, "", ""},
		{"name budget: 42 bytes", func(m *kmmv1beta1.Module) { m.Namespace, m.Name = strings.Repeat("n", 20), strings.Repeat("m", 22) },
			"metadata.name", "must be at most 41"},
		{"name budget with a version: 41 bytes (upstream's budget)", func(m *kmmv1beta1.Module) {
			m.Namespace, m.Name = strings.Repeat("n", 20), strings.Repeat("m", 21)
			container(m).Version = "v1"
		}, "", ""},
		{"name budget with a version: 42 bytes", func(m *kmmv1beta1.Module) {
			m.Namespace, m.Name = strings.Repeat("n", 20), strings.Repeat("m", 22)
			container(m).Version = "v1"
		}, "metadata.name", "must be at most 41"},

		{"device-plugin-only Module", func(m *kmmv1beta1.Module) {
			m.Spec.ModuleLoader = nil
			m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:v1"}}
		}, "", ""},
		{"neither moduleLoader nor devicePlugin", func(m *kmmv1beta1.Module) { m.Spec.ModuleLoader = nil },
			"spec.moduleLoader", "moduleLoader is required unless devicePlugin is set"},

		{"unsupported: dra", func(m *kmmv1beta1.Module) { m.Spec.DRA = &apiextensionsv1.JSON{Raw: []byte("{}")} },
			"spec.dra", "dra is not supported by kmm"},
		{"unsupported: imageRebuildTriggerGeneration", func(m *kmmv1beta1.Module) { g := int64(1); m.Spec.ImageRebuildTriggerGeneration = &g },
			"spec.imageRebuildTriggerGeneration", "not supported by kmm"},
		{"unsupported: build", func(m *kmmv1beta1.Module) { container(m).Build = &apiextensionsv1.JSON{Raw: []byte("{}")} },
			"spec.moduleLoader.container.build", "in-cluster build is not supported"},
		{"unsupported: a mapping's sign", func(m *kmmv1beta1.Module) {
			container(m).KernelMappings[0].Sign = &apiextensionsv1.JSON{Raw: []byte("{}")}
		},
			mappings + "[0].sign", "in-cluster signing is not supported"},

		{"image: no tag", func(m *kmmv1beta1.Module) { container(m).ContainerImage = "reg.example.com/nic" },
			"spec.moduleLoader.container.containerImage", "must carry a tag or a digest"},
		{"image: digest", func(m *kmmv1beta1.Module) {
			container(m).ContainerImage = "reg.example.com/nic@sha256:" + strings.Repeat("a", 64)
		}, "", ""},
		{"image: not a reference", func(m *kmmv1beta1.Module) { container(m).ContainerImage = "Reg Example/nic:v1" },
			"spec.moduleLoader.container.containerImage", "not a valid image reference"},
		{"imagePullPolicy: unknown", func(m *kmmv1beta1.Module) { container(m).ImagePullPolicy = "Sometimes" },
			"spec.moduleLoader.container.imagePullPolicy", "Unsupported value"},
		{"imagePullPolicy: Always", func(m *kmmv1beta1.Module) { container(m).ImagePullPolicy = corev1.PullAlways }, "", ""},

		{"kernelMappings: none", func(m *kmmv1beta1.Module) { container(m).KernelMappings = nil },
			mappings, "at least one kernel mapping is required"},
		{"kernelMapping: two matchers", func(m *kmmv1beta1.Module) { container(m).KernelMappings[0].Literal = "6.1.0" },
			mappings + "[0]", "exactly one of literal, regexp or versionRange"},
		{"kernelMapping: regexp that does not compile", func(m *kmmv1beta1.Module) { container(m).KernelMappings[0].Regexp = "(" },
			mappings + "[0].regexp", "not a valid Go regular expression"},
		{"kernelMapping: versionRange", func(m *kmmv1beta1.Module) {
			container(m).KernelMappings[0] = kmmv1beta1.KernelMapping{VersionRange: ">=5.14 <6"}
		}, "", ""},
		{"kernelMapping: versionRange that does not parse", func(m *kmmv1beta1.Module) {
			container(m).KernelMappings[0] = kmmv1beta1.KernelMapping{VersionRange: ">=five"}
		}, mappings + "[0].versionRange", "not a valid version range"},
		{"kernelMapping: no image anywhere", func(m *kmmv1beta1.Module) { container(m).ContainerImage = "" },
			mappings + "[0].containerImage", "every kernelMapping needs a containerImage"},
		{"kernelMapping: its own image", func(m *kmmv1beta1.Module) {
			container(m).ContainerImage = ""
			container(m).KernelMappings[0].ContainerImage = "reg.example.com/nic:$KERNEL_XYZ"
		}, "", ""},
		{"kernelMapping: its own image without a tag", func(m *kmmv1beta1.Module) { container(m).KernelMappings[0].ContainerImage = "reg.example.com/nic" },
			mappings + "[0].containerImage", "must carry a tag or a digest"},

		{"modprobe: no moduleName", func(m *kmmv1beta1.Module) { container(m).Modprobe.ModuleName = "" },
			modprobe + ".moduleName", "moduleName is required unless rawArgs is set"},
		{"modprobe: rawArgs instead of moduleName", func(m *kmmv1beta1.Module) {
			container(m).Modprobe = kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: []string{"nic"}, Unload: []string{"-r", "nic"}}}
		}, "", ""},
		{"modprobe: rawArgs without unload", func(m *kmmv1beta1.Module) {
			container(m).Modprobe.RawArgs = &kmmv1beta1.ModprobeArgs{Load: []string{"nic"}}
		}, modprobe + ".rawArgs", "rawArgs needs both load and unload"},
		{"modprobe: firmwarePath /", func(m *kmmv1beta1.Module) { container(m).Modprobe.FirmwarePath = "/" },
			modprobe + ".firmwarePath", "must be a directory below the image root"},
		{"modprobe: firmwarePath below the root", func(m *kmmv1beta1.Module) { container(m).Modprobe.FirmwarePath = "/firmware" }, "", ""},
		{"modprobe: modulesLoadingOrder starting with moduleName", func(m *kmmv1beta1.Module) {
			container(m).Modprobe.ModulesLoadingOrder = []string{"nic", "nic_dep"}
		}, "", ""},
		{"modprobe: modulesLoadingOrder starting elsewhere", func(m *kmmv1beta1.Module) {
			container(m).Modprobe.ModulesLoadingOrder = []string{"nic_dep", "nic"}
		}, modprobe + ".modulesLoadingOrder[0]", "must equal moduleName"},
		{"modprobe: modulesLoadingOrder with a repeat", func(m *kmmv1beta1.Module) {
			container(m).Modprobe.ModulesLoadingOrder = []string{"nic", "nic_dep", "nic_dep"}
		}, modprobe + ".modulesLoadingOrder[2]", "Duplicate value"},

		{"serviceAccountName: valid", func(m *kmmv1beta1.Module) { m.Spec.ModuleLoader.ServiceAccountName = "kmm-worker" }, "", ""},
		{"serviceAccountName: invalid", func(m *kmmv1beta1.Module) { m.Spec.ModuleLoader.ServiceAccountName = "Not_A_Name" },
			"spec.moduleLoader.serviceAccountName", "RFC 1123"},

		{"devicePlugin: image without a tag", func(m *kmmv1beta1.Module) {
			m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp"}}
		}, "spec.devicePlugin.container.image", "must carry a tag or a digest"},
		{"devicePlugin: initContainer image without a tag", func(m *kmmv1beta1.Module) {
			m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{
				Container:     kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:v1"},
				InitContainer: &kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/init"},
			}
		}, "spec.devicePlugin.initContainer.image", "must carry a tag or a digest"},
		{"devicePlugin: hostPath under /dev", func(m *kmmv1beta1.Module) {
			m.Spec.DevicePlugin = devicePluginWithHostPath("/dev/nic")
		}, "", ""},
		{"devicePlugin: hostPath /etc", func(m *kmmv1beta1.Module) {
			m.Spec.DevicePlugin = devicePluginWithHostPath("/etc")
		}, "spec.devicePlugin.volumes[0].hostPath.path", "only under /dev, /sys, /var, /opt or /run"},
		{"devicePlugin: invalid serviceAccountName", func(m *kmmv1beta1.Module) {
			m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:v1"}, ServiceAccountName: "a/b"}
		}, "spec.devicePlugin.serviceAccountName", "RFC 1123"},

		{"upgradePolicy: maxUnavailable 25%", func(m *kmmv1beta1.Module) { m.Spec.UpgradePolicy = maxUnavailable(intstr.FromString("25%")) }, "", ""},
		{"upgradePolicy: maxUnavailable 0", func(m *kmmv1beta1.Module) { m.Spec.UpgradePolicy = maxUnavailable(intstr.FromInt32(0)) },
			"spec.upgradePolicy.maxUnavailable", "must be a positive integer or a percentage"},
		{"upgradePolicy: maxUnavailable 101%", func(m *kmmv1beta1.Module) { m.Spec.UpgradePolicy = maxUnavailable(intstr.FromString("101%")) },
			"spec.upgradePolicy.maxUnavailable", "from 1% to 100%"},
		{"upgradePolicy: ignoredNamespacePatterns", func(m *kmmv1beta1.Module) {
			m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{IgnoredNamespacePatterns: []string{"^kube-"}}}
		}, "", ""},
		{"upgradePolicy: an ignoredNamespacePattern that does not compile", func(m *kmmv1beta1.Module) {
			m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{IgnoredNamespacePatterns: []string{"^kube-", "("}}}
		}, "spec.upgradePolicy.drain.ignoredNamespacePatterns[1]", "not a valid Go regular expression"},

		{"tolerations: valid", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "yes", Effect: corev1.TaintEffectNoSchedule}}
		}, "", ""},
		{"tolerations: invalid key", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Key: "bad key", Operator: corev1.TolerationOpExists}}
		}, "spec.tolerations[0].key", "name part must consist of"},
		{"tolerations: unknown operator", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: "Maybe"}}
		}, "spec.tolerations[0].operator", "Unsupported value"},
		{"tolerations: empty key with Equal", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpEqual}}
		}, "spec.tolerations[0].operator", "operator must be Exists when key is empty"},
		{"tolerations: value with Exists", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists, Value: "yes"}}
		}, "spec.tolerations[0].value", "value must be empty when operator is Exists"},
		{"tolerations: invalid value", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "a b"}}
		}, "spec.tolerations[0].value", "a valid label must be"},
		{"tolerations: unknown effect", func(m *kmmv1beta1.Module) {
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists, Effect: "Sometimes"}}
		}, "spec.tolerations[0].effect", "Unsupported value"},
		{"tolerations: tolerationSeconds without NoExecute", func(m *kmmv1beta1.Module) {
			s := int64(60)
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: &s}}
		}, "spec.tolerations[0].effect", "effect must be NoExecute when tolerationSeconds is set"},
		{"tolerations: tolerationSeconds with NoExecute", func(m *kmmv1beta1.Module) {
			s := int64(60)
			m.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &s}}
		}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := validModule()
			tc.mutate(m)
			check(t, validation.Module(m), tc.wantField, tc.wantMsg)
		})
	}
}

func devicePluginWithHostPath(p string) *kmmv1beta1.DevicePluginSpec {
	return &kmmv1beta1.DevicePluginSpec{
		Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:v1"},
		Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: p}}}},
	}
}

func maxUnavailable(v intstr.IntOrString) *kmmv1beta1.UpgradePolicy {
	return &kmmv1beta1.UpgradePolicy{MaxUnavailable: &v}
}

func TestModuleUpdate(t *testing.T) {
	const version = "spec.moduleLoader.container.version"
	versioned := func(v, image string) *kmmv1beta1.Module {
		m := validModule()
		container(m).Version, container(m).ContainerImage = v, image
		return m
	}
	cases := []struct {
		name      string
		old, new  *kmmv1beta1.Module
		wantField string
		wantMsg   string
	}{
		{"no version, image changed", versioned("", "r/nic:v1"), versioned("", "r/nic:v2"), "", ""},
		{"version added", versioned("", "r/nic:v1"), versioned("v1", "r/nic:v1"), version, "version cannot be added to or removed from"},
		{"version removed", versioned("v1", "r/nic:v1"), versioned("", "r/nic:v1"), version, "version cannot be added to or removed from"},
		{"version and image changed together", versioned("v1", "r/nic:v1"), versioned("v2", "r/nic:v2"), "", ""},
		{"version changed alone", versioned("v1", "r/nic:v1"), versioned("v2", "r/nic:v1"), version, "the version changed but no kmod image did"},
		{"image changed alone", versioned("v1", "r/nic:v1"), versioned("v1", "r/nic:v2"), version, "a kmod image changed but the version did not"},
		{"the rules of Module too", versioned("", "r/nic:v1"), versioned("", "r/nic"), "spec.moduleLoader.container.containerImage", "must carry a tag or a digest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check(t, validation.ModuleUpdate(tc.new, tc.old), tc.wantField, tc.wantMsg)
		})
	}
}

func TestModuleConfig(t *testing.T) {
	valid := func() *kmmv1beta1.ModuleConfig {
		return &kmmv1beta1.ModuleConfig{
			KernelVersion:  "6.1.0-56-cloud-amd64",
			ContainerImage: "reg.example.com/nic:6.1.0-56-cloud-amd64",
			Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "nic"},
		}
	}
	cases := []struct {
		name    string
		mutate  func(c *kmmv1beta1.ModuleConfig)
		wantMsg string
	}{
		{"valid", func(*kmmv1beta1.ModuleConfig) {}, ""},
		{"kernelVersion missing", func(c *kmmv1beta1.ModuleConfig) { c.KernelVersion = "" }, "config.kernelVersion is required"},
		{"kernelVersion with a slash", func(c *kmmv1beta1.ModuleConfig) { c.KernelVersion = "../6.1" }, "is not a kernel version"},
		{"containerImage missing", func(c *kmmv1beta1.ModuleConfig) { c.ContainerImage = "" }, "config.containerImage is required"},
		{"moduleName missing", func(c *kmmv1beta1.ModuleConfig) { c.Modprobe.ModuleName = "" }, "config.modprobe.moduleName is required unless rawArgs is set"},
		{"rawArgs instead of moduleName", func(c *kmmv1beta1.ModuleConfig) {
			c.Modprobe = kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: []string{"nic"}, Unload: []string{"-r", "nic"}}}
		}, ""},
		{"firmwarePath /", func(c *kmmv1beta1.ModuleConfig) { c.Modprobe.FirmwarePath = "//" }, "config.modprobe.firmwarePath must be a directory below the image root"},
		{"firmwarePath below the root", func(c *kmmv1beta1.ModuleConfig) { c.Modprobe.FirmwarePath = "/firmware" }, ""},
		{"modulesLoadingOrder starting elsewhere", func(c *kmmv1beta1.ModuleConfig) { c.Modprobe.ModulesLoadingOrder = []string{"dep", "nic"} },
			"the first entry of config.modprobe.modulesLoadingOrder must equal moduleName"},
		{"modulesLoadingOrder starting with moduleName", func(c *kmmv1beta1.ModuleConfig) { c.Modprobe.ModulesLoadingOrder = []string{"nic", "dep"} }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(c)
			err := validation.ModuleConfig(c)
			switch {
			case tc.wantMsg == "" && err != nil:
				t.Fatalf("want no error, got %v", err)
			case tc.wantMsg != "" && (err == nil || !strings.Contains(err.Error(), tc.wantMsg)):
				t.Fatalf("want an error saying %q, got %v", tc.wantMsg, err)
			}
		})
	}
}

func TestPreflightValidation(t *testing.T) {
	cases := []struct {
		name      string
		spec      kmmv1beta1.PreflightValidationSpec
		wantField string
		wantMsg   string
	}{
		{"valid", kmmv1beta1.PreflightValidationSpec{KernelVersion: "6.1.0-56-cloud-amd64"}, "", ""},
		{"kernelVersion that does not parse", kmmv1beta1.PreflightValidationSpec{KernelVersion: "six"},
			"spec.kernelVersion", "not a kernel version as node.status.nodeInfo.kernelVersion shows one"},
		{"pushBuiltImage", kmmv1beta1.PreflightValidationSpec{KernelVersion: "6.1.0", PushBuiltImage: true},
			"spec.pushBuiltImage", "kmm does not build images"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check(t, validation.PreflightValidation(&kmmv1beta1.PreflightValidation{Spec: tc.spec}), tc.wantField, tc.wantMsg)
		})
	}
}
