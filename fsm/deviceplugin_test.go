package fsm

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestKeepOldDevicePlugin: which of a Module's other device plugin DaemonSets stay. The first case
// is the ordered upgrade's special case: it fails if the old version's DaemonSet is deleted while a
// node is still labelled for it.
func TestKeepOldDevicePlugin(t *testing.T) {
	key := kmmv1beta1.DevicePluginVersionLabel("ns", "m")
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}
	deleting := m.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Unix(100, 0)}
	legacy, _ := kmmv1beta1.LegacyDevicePluginVersionLabel("ns", "m")
	v1 := map[string]string{kmmv1beta1.ReadyLabel("ns", "m"): "", key: "v1"}
	legacyV1 := map[string]string{kmmv1beta1.ReadyLabel("ns", "m"): "", legacy: "v1"}
	onV1, onV2 := map[string]string{key: "v1"}, map[string]string{key: "v2"}
	cases := []struct {
		name     string
		m        *kmmv1beta1.Module
		selector map[string]string
		nodes    []map[string]string
		want     bool
	}{
		{"special case: v1's DaemonSet while a node is still labelled for v1", m, v1, []map[string]string{onV2, onV1}, true},
		{"an older kmm's v1 DaemonSet (legacy key) while a node carries the legacy label for v1", m, legacyV1,
			[]map[string]string{onV2, {legacy: "v1"}}, true},
		{"an older kmm's v1 DaemonSet once no node carries the legacy label for v1", m, legacyV1, []map[string]string{onV1, {legacy: "v2"}}, false},
		{"v1's DaemonSet once every node moved to v2", m, v1, []map[string]string{onV2, onV2}, false},
		{"v1's DaemonSet, no node labelled at all", m, v1, []map[string]string{{}, nil}, false},
		{"no nodes", m, v1, nil, false},
		{"an unversioned DaemonSet (the Module got a version)", m, map[string]string{kmmv1beta1.ReadyLabel("ns", "m"): ""}, []map[string]string{onV1}, false},
		{"the Module is being deleted", deleting, v1, []map[string]string{onV1}, false},
		{"another Module's version label says nothing", m, map[string]string{kmmv1beta1.DevicePluginVersionLabel("ns", "other"): "v1"},
			[]map[string]string{{kmmv1beta1.DevicePluginVersionLabel("ns", "other"): "v1"}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := KeepOldDevicePlugin(tc.m, tc.selector, tc.nodes); got != tc.want {
				t.Errorf("KeepOldDevicePlugin = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDevicePluginVersionKey: the current DaemonSet's selector moves to upstream's
// version-schedule-pod label only once every node with the legacy label for the version carries the
// new one too (a DaemonSet moved earlier loses its pod on that node).
func TestDevicePluginVersionKey(t *testing.T) {
	key := kmmv1beta1.DevicePluginVersionLabel("ns", "m")
	legacy, _ := kmmv1beta1.LegacyDevicePluginVersionLabel("ns", "m")
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"},
		Spec: kmmv1beta1.ModuleSpec{ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{Version: "v1"}}}}
	unversioned := m.DeepCopy()
	unversioned.Spec.ModuleLoader.Container.Version = ""
	long := m.DeepCopy()
	long.Namespace, long.Name = "n2345678901234567890", "m23456789012345678901" // 41: no legacy key exists
	cases := []struct {
		name  string
		m     *kmmv1beta1.Module
		nodes []map[string]string
		want  string
	}{
		{"no node labelled", m, []map[string]string{{}, nil}, key},
		{"a node with only the legacy label: stay on it", m, []map[string]string{{key: "v1", legacy: "v1"}, {legacy: "v1"}}, legacy},
		{"every node has both: move", m, []map[string]string{{key: "v1", legacy: "v1"}, {key: "v1", legacy: "v1"}}, key},
		{"the legacy label of another version does not hold the move", m, []map[string]string{{key: "v1"}, {legacy: "v0"}}, key},
		{"new label of another version beside the legacy one", m, []map[string]string{{key: "v2", legacy: "v1"}}, legacy},
		{"unversioned", unversioned, []map[string]string{{legacy: "v1"}}, key},
		{"a 41-character Module has no legacy key", long, nil, kmmv1beta1.DevicePluginVersionLabel(long.Namespace, long.Name)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := DevicePluginVersionKey(tc.m, tc.nodes); got != tc.want {
				t.Errorf("DevicePluginVersionKey = %q, want %q", got, tc.want)
			}
		})
	}
}
