package fsm

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func testModule(version string) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "nic"},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"role": "worker"},
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

func testNode(kernel string, labels map[string]string) NodeView {
	l := map[string]string{"role": "worker"}
	for k, v := range labels {
		l[k] = v
	}
	return NodeView{Name: "n1", Labels: l, KernelVersion: kernel, Ready: true}
}

// TestDecideSpec covers every branch of seed 000's Module-NMC flowchart, one case per rule.
func TestDecideSpec(t *testing.T) {
	versionLabel := kmmv1beta1.WorkerPodVersionLabel("drivers", "nic")
	deleted := testModule("")
	deleted.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
	pluginOnly := testModule("")
	pluginOnly.Spec.ModuleLoader = nil
	pluginOnly.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{}
	cases := []struct {
		name       string
		module     *kmmv1beta1.Module
		node       NodeView
		wantAction SpecAction
		wantReason string
		wantImage  string
	}{
		{name: "rule 1: node not matching the selector gets no entry", module: testModule(""),
			node: NodeView{Labels: map[string]string{"role": "infra"}, KernelVersion: "5.14.0-1.el9.x86_64"}, wantAction: SpecDelete, wantReason: ReasonNotSelected},
		{name: "rule 1: a NotReady, cordoned node still gets its entry", module: testModule(""),
			node: NodeView{Labels: map[string]string{"role": "worker"}, KernelVersion: "5.14.0-1.el9.x86_64", Unschedulable: true}, wantAction: SpecUpdate, wantReason: ReasonDesired, wantImage: "reg.example.com/nic:literal"},
		{name: "a device-plugin-only Module loads nothing on a selected node", module: pluginOnly,
			node: testNode("5.14.0-1.el9.x86_64", nil), wantAction: SpecDelete, wantReason: ReasonDevicePluginOnly},
		{name: "rule 2: no kernel mapping for the node's kernel does nothing", module: testModule(""),
			node: testNode("4.18.0-1.el8.x86_64", nil), wantAction: SpecKeep, wantReason: ReasonNoKernelMapping},
		{name: "rule 3: mapping found, no version: update (literal)", module: testModule(""),
			node: testNode("5.14.0-1.el9.x86_64", nil), wantAction: SpecUpdate, wantReason: ReasonDesired, wantImage: "reg.example.com/nic:literal"},
		{name: "rule 3: mapping found, no version: update (regexp, default image templated)", module: testModule(""),
			node: testNode("6.1.0-56-cloud-amd64", nil), wantAction: SpecUpdate, wantReason: ReasonDesired, wantImage: "reg.example.com/drivers/nic:6.1.0-56-cloud-amd64"},
		{name: "rule 3: mapping found, no version: update (versionRange, trailing + ignored)", module: testModule(""),
			node: testNode("6.10.3-100+", nil), wantAction: SpecUpdate, wantReason: ReasonDesired, wantImage: "reg.example.com/nic:6.10.3"},
		{name: "rule 4: version label equals Version: update", module: testModule("v2"),
			node: testNode("5.14.0-1.el9.x86_64", map[string]string{versionLabel: "v2"}), wantAction: SpecUpdate, wantReason: ReasonDesired, wantImage: "reg.example.com/nic:literal"},
		{name: "rule 5: version label older than Version: do nothing", module: testModule("v2"),
			node: testNode("5.14.0-1.el9.x86_64", map[string]string{versionLabel: "v1"}), wantAction: SpecKeep, wantReason: ReasonVersionPending},
		{name: "rule 6: version label missing: delete the entry", module: testModule("v2"),
			node: testNode("5.14.0-1.el9.x86_64", nil), wantAction: SpecDelete, wantReason: ReasonVersionMissing},
		{name: "Module deleted: delete the entry", module: deleted,
			node: testNode("5.14.0-1.el9.x86_64", nil), wantAction: SpecDelete, wantReason: ReasonModuleDeleted},
		{name: "unparsable kernel version is reported, not loaded", module: testModule(""),
			node: testNode("garbage", nil), wantAction: SpecKeep, wantReason: ReasonInvalidKernel},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideSpec(tc.module, tc.node)
			if d.Action != tc.wantAction || d.Reason != tc.wantReason {
				t.Fatalf("DecideSpec = %s/%s (%s), want %s/%s", d.Action, d.Reason, d.Message, tc.wantAction, tc.wantReason)
			}
			if tc.wantImage != "" && (d.Entry == nil || d.Entry.Config.ContainerImage != tc.wantImage) {
				t.Fatalf("entry = %+v, want image %s", d.Entry, tc.wantImage)
			}
		})
	}
}
