package v1beta1

import "strings"

// Node label keys (SPEC §3, §7). <ns> and <name> are the Module's namespace and name; with a version set their
// combined length is at most 39 so that every key stays a valid label key (kmmv1beta1.MaxVersionedNameLength).

// ReadyLabel marks a node where the module is loaded; device plugin DaemonSets select on it.
func ReadyLabel(namespace, name string) string {
	return labelDomain + namespace + "." + name + ".ready"
}

// VersionReadyLabel names the module version loaded on a node.
func VersionReadyLabel(namespace, name string) string {
	return labelDomain + namespace + "." + name + ".version.ready"
}

// DevicePluginReadyLabel marks a node where the Module's device plugin pod is Ready (upstream KMM's
// device-plugin-ready label).
func DevicePluginReadyLabel(namespace, name string) string {
	return labelDomain + namespace + "." + name + ".device-plugin-ready"
}

// DRAReadyLabel marks a node where the Module's DRA driver pod is Ready (upstream KMM's dra-ready
// label).
func DRAReadyLabel(namespace, name string) string {
	return labelDomain + namespace + "." + name + ".dra-ready"
}

// StateLabels are the node labels the NMC controller writes for a Module's pair on the node: ReadyLabel,
// VersionReadyLabel, DevicePluginReadyLabel and DRAReadyLabel. No decision of the Module→NMC
// controller reads them but through a Module's selector.
func StateLabels(namespace, name string) []string {
	return []string{ReadyLabel(namespace, name), VersionReadyLabel(namespace, name), DevicePluginReadyLabel(namespace, name),
		DRAReadyLabel(namespace, name)}
}

// ModuleVersionLabel is the user's label requesting a module version on a node (ordered upgrade).
func ModuleVersionLabel(namespace, name string) string {
	return "kmm.node.kubernetes.io/version-module." + namespace + "." + name
}

// WorkerPodVersionLabel is the internal label saying which version the worker pods may load
// (seed 000's "module loader version label").
func WorkerPodVersionLabel(namespace, name string) string {
	return workerPodVersionPrefix + namespace + "." + name
}

// DevicePluginVersionLabel is the internal label saying which device plugin (or DRA driver) version
// may run on a node.
func DevicePluginVersionLabel(namespace, name string) string {
	return devicePluginVersionPrefix + namespace + "." + name
}

// Prefixes of the label keys above, before "<ns>.<name>".
const (
	labelDomain               = "kmm.node.kubernetes.io/"
	workerPodVersionPrefix    = "beta.kmm.node.kubernetes.io/version-worker-pod."
	devicePluginVersionPrefix = "beta.kmm.node.kubernetes.io/version-device-plugin."
)

// ParseInternalVersionLabel returns the Module ("<ns>/<name>") of an internal version label key
// (WorkerPodVersionLabel, DevicePluginVersionLabel); ok is false for any other key. A namespace
// has no dots, so the first dot after the prefix ends it.
func ParseInternalVersionLabel(key string) (module string, ok bool) {
	rest, ok := strings.CutPrefix(key, workerPodVersionPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(key, devicePluginVersionPrefix)
	}
	ns, name, dotted := strings.Cut(rest, ".")
	if !ok || !dotted {
		return "", false
	}
	return ns + "/" + name, true
}

// UpgradeSkipLabel is the node label that, when present (any value), keeps the automatic rollout of
// spec.upgradePolicy from moving that node's version-module label; the node does not count
// toward maxUnavailable either.
func UpgradeSkipLabel(namespace, name string) string {
	return "kmm.node.kubernetes.io/upgrade-skip." + namespace + "." + name
}
