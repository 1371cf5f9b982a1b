package fsm

import (
	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// KeepOldDevicePlugin says whether a device plugin DaemonSet of Module m that is not its current one
// stays. During an ordered upgrade (seed 002) the DaemonSet of an older version, whose pods run only
// on nodes whose version-device-plugin label names that version (its node selector), stays while
// some node still carries that label: its pods leave a node when the upgrade moves the node's label,
// not all at once when the Module's version changes. Any other DaemonSet goes, and none stays once
// the Module is being deleted. nodeLabels are the labels of every node.
func KeepOldDevicePlugin(m *kmmv1beta1.Module, dsNodeSelector map[string]string, nodeLabels []map[string]string) bool {
	if !m.DeletionTimestamp.IsZero() {
		return false
	}
	key := kmmv1beta1.DevicePluginVersionLabel(m.Namespace, m.Name)
	v, ok := dsNodeSelector[key]
	if !ok {
		return false
	}
	for _, labels := range nodeLabels {
		if labels[key] == v {
			return true
		}
	}
	return false
}
