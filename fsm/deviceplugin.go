package fsm

import (
	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// KeepOldDevicePlugin says whether a device plugin DaemonSet of Module m that is not its current one
// stays. During an ordered upgrade (seed 002) the DaemonSet of an older version, whose pods run only
// on nodes whose version-schedule-pod label names that version (its node selector; the legacy
// version-device-plugin label for a DaemonSet an older kmm wrote), stays while some node still
// carries that label: its pods leave a node when the upgrade moves the node's label, not all at once
// when the Module's version changes. Any other DaemonSet goes, and none stays once the Module is
// being deleted. nodeLabels are the labels of every node.
func KeepOldDevicePlugin(m *kmmv1beta1.Module, dsNodeSelector map[string]string, nodeLabels []map[string]string) bool {
	if !m.DeletionTimestamp.IsZero() {
		return false
	}
	keys := []string{kmmv1beta1.DevicePluginVersionLabel(m.Namespace, m.Name)}
	if legacy, ok := kmmv1beta1.LegacyDevicePluginVersionLabel(m.Namespace, m.Name); ok {
		keys = append(keys, legacy)
	}
	for _, key := range keys {
		v, ok := dsNodeSelector[key]
		if !ok {
			continue
		}
		for _, labels := range nodeLabels {
			if labels[key] == v {
				return true
			}
		}
	}
	return false
}

// DevicePluginVersionKey is the node label key the current device plugin DaemonSet of a versioned
// Module selects its version on: upstream's version-schedule-pod label, unless some node still
// carries only the legacy version-device-plugin label for the Module's version (a node taken over
// from an older upstream KMM or kmm, before the version label controller copied it). A DaemonSet
// moved to the new key before the node carries it would lose its pod there, so the selector moves
// only once every such node has both; the legacy label is dropped after that (upgrade.LegacyLabel).
func DevicePluginVersionKey(m *kmmv1beta1.Module, nodeLabels []map[string]string) string {
	key := kmmv1beta1.DevicePluginVersionLabel(m.Namespace, m.Name)
	legacy, ok := kmmv1beta1.LegacyDevicePluginVersionLabel(m.Namespace, m.Name)
	v := m.Spec.Version()
	if !ok || v == "" {
		return key
	}
	for _, labels := range nodeLabels {
		if labels[legacy] == v && labels[key] != v {
			return legacy
		}
	}
	return key
}
