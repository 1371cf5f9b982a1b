package v1beta1

import "strings"

// Node label keys (SPEC §3, §7). <ns> and <name> are the Module's namespace and name; their combined
// length is at most MaxNameLength (41) so that every key stays a valid label key: the longest,
// beta.kmm.node.kubernetes.io/version-schedule-pod.<ns>.<name>, then has a 63-character name part.

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

// DevicePluginVersionLabel is the internal label saying which version of the Module's scheduled pods
// (its device plugin or DRA driver) may run on a node: upstream KMM's version-schedule-pod label.
func DevicePluginVersionLabel(namespace, name string) string {
	return devicePluginVersionPrefix + namespace + "." + name
}

// LegacyDevicePluginVersionLabel is the name DevicePluginVersionLabel had before upstream KMM renamed
// it (beta.kmm.node.kubernetes.io/version-device-plugin.<ns>.<name>), which nodes taken over from an
// older upstream KMM or an older kmm still carry; ok is false when the key would not be a valid label
// key (len(namespace)+len(name) = 41), and then no node can carry it.
func LegacyDevicePluginVersionLabel(namespace, name string) (key string, ok bool) {
	key = LegacyDevicePluginVersionPrefix + namespace + "." + name
	return key, len(key)-len("beta.kmm.node.kubernetes.io/") <= 63
}

// Prefixes of the label keys above, before "<ns>.<name>".
const (
	labelDomain               = "kmm.node.kubernetes.io/"
	workerPodVersionPrefix    = "beta.kmm.node.kubernetes.io/version-worker-pod."
	devicePluginVersionPrefix = "beta.kmm.node.kubernetes.io/version-schedule-pod."
	// LegacyDevicePluginVersionPrefix is devicePluginVersionPrefix before upstream's rename.
	LegacyDevicePluginVersionPrefix = "beta.kmm.node.kubernetes.io/version-device-plugin."
)

// ParseInternalVersionLabel returns the Module ("<ns>/<name>") of an internal version label key
// (WorkerPodVersionLabel, DevicePluginVersionLabel, LegacyDevicePluginVersionLabel); ok is false for
// any other key. A namespace has no dots, so the first dot after the prefix ends it.
func ParseInternalVersionLabel(key string) (module string, ok bool) {
	var rest string
	for _, prefix := range []string{workerPodVersionPrefix, devicePluginVersionPrefix, LegacyDevicePluginVersionPrefix} {
		if rest, ok = strings.CutPrefix(key, prefix); ok {
			break
		}
	}
	ns, name, dotted := strings.Cut(rest, ".")
	if !ok || !dotted {
		return "", false
	}
	return ns + "/" + name, true
}

// NamespaceLabel marks a namespace that holds Modules (upstream KMM's label, set and removed by the
// Module controller): the validating webhook refuses to delete such a namespace, because the
// Modules' unload worker pods run in it.
const NamespaceLabel = "kmm.node.k8s.io/contains-modules"

// UpgradeSkipLabel is the node label that, when present (any value), keeps the automatic rollout of
// spec.upgradePolicy from moving that node's version-module label; the node does not count
// toward maxUnavailable either.
func UpgradeSkipLabel(namespace, name string) string {
	return "kmm.node.kubernetes.io/upgrade-skip." + namespace + "." + name
}

// RolloutResumeAnnotation is the Module annotation that resumes a rollout its failure budget
// paused: a value other than status.rollout.observedResume (kubectl kmm rollout resume writes the
// time) resumes it once. The controller reads at most MaxRolloutResumeLength characters of it.
const RolloutResumeAnnotation = "kmm.sigs.x-k8s.io/rollout-resume"

// MaxRolloutResumeLength bounds the part of the rollout-resume annotation the controller reads.
const MaxRolloutResumeLength = 64

// RolloutUndoAnnotation is the Module annotation that rolls its rollout back (kubectl kmm rollout
// undo writes the time): a value other than status.rollout.observedUndo moves every node back to
// status.rollout.previous, until the version changes or the rollout is resumed. The controller
// reads at most MaxRolloutResumeLength characters of it.
const RolloutUndoAnnotation = "kmm.sigs.x-k8s.io/rollout-undo"
