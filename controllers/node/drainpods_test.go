package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/fsm"
)

// TestDrainSparesKMMAndNodeBoundPods: the pods as kmm builds them (the worker pod of each action,
// the device plugin pod) and any pod with kmm's managed-by label are spared by a drain, as are a
// static pod's mirror and a DaemonSet's pod; a workload, a ReplicaSet's pod or a pod another tool
// manages is not (issue 34: an empty podSelector evicted other Modules' worker pods).
func TestDrainSparesKMMAndNodeBoundPods(t *testing.T) {
	worker := func(a contract.Action) *corev1.Pod {
		in := intent("", false)
		in.Action = a
		if a == contract.ActionReload {
			in.Previous = &in.Entry.Config
		}
		p, err := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, in)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "gpu"},
		Spec: kmmv1beta1.ModuleSpec{DevicePlugin: &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "dp:1"}}}}
	dsName := module.DevicePluginName(m)
	tmpl := module.DevicePluginTemplate(m)
	devicePlugin := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	devicePlugin.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: dsName, UID: "ds", Controller: ptr.To(true)}}
	owned := func(kind string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: kind, Name: "x", UID: "x", Controller: ptr.To(true)}}}}
	}
	withLabels := func(l map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: l}}
	}

	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"a load worker pod", worker(contract.ActionLoad), fsm.SparedKMM},
		{"an unload worker pod", worker(contract.ActionUnload), fsm.SparedKMM},
		{"a reload worker pod", worker(contract.ActionReload), fsm.SparedKMM},
		{"kmm's device plugin pod", devicePlugin, fsm.SparedKMM},
		{"a kind of kmm pod added later (kmm's label only)", withLabels(map[string]string{contract.LabelManagedBy: contract.ManagedBy}), fsm.SparedKMM},
		{"a static pod's mirror", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-n1", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "h"}}}, fsm.SparedMirror},
		{"a DaemonSet's pod", owned("DaemonSet"), fsm.SparedDaemonSet},
		{"a ReplicaSet's pod", owned("ReplicaSet"), ""},
		{"a plain pod", withLabels(nil), ""},
		{"a pod another tool manages", withLabels(map[string]string{contract.LabelManagedBy: "Helm"}), ""},
		{"a pod with kmm's module labels but not its managed-by label", withLabels(map[string]string{
			contract.LabelModuleNamespace: "drivers", contract.LabelModuleName: "gpu"}), ""},
	}
	for _, c := range cases {
		if got := observeWorkload(c.pod, nil).Spared(); got != c.want {
			t.Errorf("%s: spared %q, want %q (labels %v)", c.name, got, c.want, c.pod.Labels)
		}
	}
}
