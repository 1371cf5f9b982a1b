package validation_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
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
			"spec.moduleLoader", "moduleLoader is required unless devicePlugin or dra is set"},

		{"dra beside moduleLoader", func(m *kmmv1beta1.Module) { m.Spec.DRA = draSpec() }, "", ""},
		{"dra-only Module", func(m *kmmv1beta1.Module) { m.Spec.ModuleLoader, m.Spec.DRA = nil, draSpec() }, "", ""},
		{"dra and devicePlugin", func(m *kmmv1beta1.Module) {
			m.Spec.DRA = draSpec()
			m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:v1"}}
		}, "spec.dra", "mutually exclusive"},
		{"dra: driver name not a DNS subdomain", func(m *kmmv1beta1.Module) { m.Spec.DRA = draSpec(); m.Spec.DRA.DriverName = "GPU_driver" },
			"spec.dra.driverName", "DNS subdomain"},
		{"dra: duplicate DeviceClass", func(m *kmmv1beta1.Module) {
			m.Spec.DRA = draSpec()
			m.Spec.DRA.DeviceClasses = append(m.Spec.DRA.DeviceClasses, m.Spec.DRA.DeviceClasses[0])
		}, "spec.dra.deviceClasses[1].name", "Duplicate"},
		{"dra: host path outside the allowed prefixes", func(m *kmmv1beta1.Module) {
			m.Spec.DRA = draSpec()
			m.Spec.DRA.Volumes = []corev1.Volume{{Name: "etc", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}}}
		}, "spec.dra.volumes[0].hostPath.path", "DRA driver may mount host paths only"},
		{"imageRebuildTriggerGeneration", func(m *kmmv1beta1.Module) { g := int64(1); m.Spec.ImageRebuildTriggerGeneration = &g }, "", ""},
		{"build", func(m *kmmv1beta1.Module) { container(m).Build = validBuild() }, "", ""},
		{"sign with globs", func(m *kmmv1beta1.Module) { container(m).KernelMappings[0].Sign = validSign() }, "", ""},
		{"build: no dockerfileConfigMap", func(m *kmmv1beta1.Module) { container(m).Build = &kmmv1beta1.Build{} },
			"spec.moduleLoader.container.build.dockerfileConfigMap.name", "Required value"},
		{"build: dockerfileConfigMap without a name", func(m *kmmv1beta1.Module) {
			container(m).Build = &kmmv1beta1.Build{DockerfileConfigMap: &corev1.LocalObjectReference{}}
		}, "spec.moduleLoader.container.build.dockerfileConfigMap.name", "Required value"},
		{"build: 65 build args", func(m *kmmv1beta1.Module) {
			b := validBuild()
			for i := range 65 {
				b.BuildArgs = append(b.BuildArgs, kmmv1beta1.BuildArg{Name: fmt.Sprint("A", i)})
			}
			container(m).KernelMappings[0].Build = b
		}, mappings + "[0].build.buildArgs", "must have at most 64 items"},
		{"build: a build arg without a name", func(m *kmmv1beta1.Module) {
			b := validBuild()
			b.BuildArgs = []kmmv1beta1.BuildArg{{Value: "x"}}
			container(m).Build = b
		}, "spec.moduleLoader.container.build.buildArgs[0].name", "needs a name"},
		{"build: 17 secrets", func(m *kmmv1beta1.Module) {
			b := validBuild()
			b.Secrets = make([]corev1.LocalObjectReference, 17)
			for i := range b.Secrets {
				b.Secrets[i].Name = fmt.Sprint("s", i)
			}
			container(m).Build = b
		}, "spec.moduleLoader.container.build.secrets", "must have at most 16 items"},
		{"build: a bad selector value", func(m *kmmv1beta1.Module) {
			b := validBuild()
			b.Selector = map[string]string{"role": "a b"}
			container(m).Build = b
		}, "spec.moduleLoader.container.build.selector[role]", "not a valid label value"},
		{"sign: no keySecret", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.KeySecret = nil
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.keySecret.name", "Required value"},
		{"sign: a bad certSecret name", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.CertSecret.Name = "Cert_1"
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.certSecret.name", "RFC 1123"},
		{"sign: no filesToSign", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.FilesToSign = nil
			container(m).KernelMappings[0].Sign = s
		}, mappings + "[0].sign.filesToSign", "at least one"},
		{"sign: 65 filesToSign", func(m *kmmv1beta1.Module) {
			s := validSign()
			for i := range 64 {
				s.FilesToSign = append(s.FilesToSign, fmt.Sprintf("/opt/m%d.ko", i))
			}
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.filesToSign", "must have at most 64 items"},
		{"sign: a relative path", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.FilesToSign = []string{"opt/a.ko"}
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.filesToSign[0]", "absolute"},
		{"sign: outside dirName", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.FilesToSign = []string{"/opt/../etc/a.ko"}
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.filesToSign[0]", "under modprobe.dirName /opt/"},
		{"sign: under another dirName", func(m *kmmv1beta1.Module) {
			container(m).Modprobe.DirName = "/modules/"
			s := validSign()
			s.FilesToSign = []string{"/modules/lib/modules/*/a.ko"}
			container(m).Sign = s
		}, "", ""},
		{"sign: a bad glob", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.FilesToSign = []string{"/opt/[a-.ko"}
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.filesToSign[0]", "not a valid glob"},
		{"sign: unsignedImage without a tag", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.UnsignedImage = "reg.example.com/kmod"
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.unsignedImage", "tag or a digest"},
		{"sign: unsignedImage with an unknown variable", func(m *kmmv1beta1.Module) {
			s := validSign()
			s.UnsignedImage = "reg.example.com/kmod:$NOPE"
			container(m).Sign = s
		}, "spec.moduleLoader.container.sign.unsignedImage", "NOPE"},

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
		{"upgradePolicy: maxFailed 2", func(m *kmmv1beta1.Module) {
			m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{MaxFailed: ptr.To(intstr.FromInt32(2))}
		}, "", ""},
		{"upgradePolicy: maxFailed 0", func(m *kmmv1beta1.Module) {
			m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{MaxFailed: ptr.To(intstr.FromInt32(0))}
		}, "spec.upgradePolicy.maxFailed", "leave it out for no budget"},
		{"upgradePolicy: maxFailed 0%", func(m *kmmv1beta1.Module) {
			m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{MaxFailed: ptr.To(intstr.FromString("0%"))}
		}, "spec.upgradePolicy.maxFailed", "from 1% to 100%"},
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
			check(t, validation.Admission(m), tc.wantField, tc.wantMsg)
		})
	}
}

func validBuild() *kmmv1beta1.Build {
	return &kmmv1beta1.Build{
		DockerfileConfigMap: &corev1.LocalObjectReference{Name: "dockerfile"},
		BuildArgs:           []kmmv1beta1.BuildArg{{Name: "DRIVER", Value: "1.2"}},
		Secrets:             []corev1.LocalObjectReference{{Name: "git-token"}},
		Selector:            map[string]string{"node-role.kubernetes.io/builder": ""},
		KanikoParams:        &kmmv1beta1.KanikoParams{Tag: "v1"},
	}
}

func validSign() *kmmv1beta1.Sign {
	return &kmmv1beta1.Sign{
		UnsignedImage: "reg.example.com/kmod:$KERNEL_FULL_VERSION-unsigned",
		KeySecret:     &corev1.LocalObjectReference{Name: "key"},
		CertSecret:    &corev1.LocalObjectReference{Name: "cert"},
		FilesToSign:   []string{"/opt/lib/modules/$KERNEL_FULL_VERSION/nic.ko", "/opt/lib/modules/*/[!x]*.ko"},
	}
}

// TestBuildAndSignCarriedOut: a Module with a build or sign recipe passes admission and the
// controllers' re-check alike: the image controller carries both out (issue 37).
func TestBuildAndSignCarriedOut(t *testing.T) {
	m := validModule()
	g := int64(2)
	m.Spec.ImageRebuildTriggerGeneration = &g
	container(m).Sign = validSign()
	container(m).KernelMappings[0].Build = validBuild()
	if errs := validation.Admission(m); len(errs) != 0 {
		t.Fatalf("admission rejects build and sign: %v", errs.ToAggregate())
	}
	if errs := validation.Module(m); len(errs) != 0 {
		t.Fatalf("the re-check holds back build and sign: %v", errs.ToAggregate())
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
		spec      kmmv1beta2.PreflightValidationSpec
		wantField string
		wantMsg   string
	}{
		{"valid", kmmv1beta2.PreflightValidationSpec{KernelVersion: "6.1.0-56-cloud-amd64"}, "", ""},
		{"kernelVersion that does not parse", kmmv1beta2.PreflightValidationSpec{KernelVersion: "six"},
			"spec.kernelVersion", "not a kernel version as node.status.nodeInfo.kernelVersion shows one"},
		{"pushBuiltImage", kmmv1beta2.PreflightValidationSpec{KernelVersion: "6.1.0", PushBuiltImage: true}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check(t, validation.PreflightValidation(&kmmv1beta2.PreflightValidation{Spec: tc.spec}), tc.wantField, tc.wantMsg)
		})
	}
}

// draSpec is a valid spec.dra.
func draSpec() *kmmv1beta1.DRASpec {
	return &kmmv1beta1.DRASpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dra:v1"},
		DriverName: "gpu.example.com", DeviceClasses: []kmmv1beta1.DeviceClassSpec{{Name: "gpu.example.com"}}}
}
