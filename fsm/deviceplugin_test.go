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
	v1 := map[string]string{kmmv1beta1.ReadyLabel("ns", "m"): "", key: "v1"}
	onV1, onV2 := map[string]string{key: "v1"}, map[string]string{key: "v2"}
	cases := []struct {
		name     string
		m        *kmmv1beta1.Module
		selector map[string]string
		nodes    []map[string]string
		want     bool
	}{
		{"special case: v1's DaemonSet while a node is still labelled for v1", m, v1, []map[string]string{onV2, onV1}, true},
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
