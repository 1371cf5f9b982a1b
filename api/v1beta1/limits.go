package v1beta1

import "strings"

// MaxNameLength is the longest namespace+name of any Module, with or without a version (upstream
// KMM's budget): its name ends up in node label keys, the longest being
// beta.kmm.node.kubernetes.io/version-schedule-pod.<namespace>.<name>, whose name part is then 63
// characters, the most a label key may have. The CRD enforces len(name) <= MaxNameLength-1 (a CEL
// rule sees the name but not the namespace); the webhook and the controllers check the sum.
const MaxNameLength = 41

// DevicePluginHostPathPrefixes are the host directories a device plugin pod may mount: devices,
// sysfs, the kubelet's device-plugin sockets (/var), vendor trees (/opt) and runtime sockets (/run).
// Device plugin pods are privileged: write access to Modules is root on the selected nodes, and
// these prefixes keep at least /etc, /root, /home and / itself out of reach of a mount.
var DevicePluginHostPathPrefixes = []string{"/dev", "/sys", "/var", "/opt", "/run"}

// DevicePluginHostPathAllowed says whether a device plugin may mount host path p.
func DevicePluginHostPathAllowed(p string) bool {
	if strings.Contains(p, "..") {
		return false
	}
	for _, prefix := range DevicePluginHostPathPrefixes {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}
