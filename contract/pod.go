package contract

import "time"

// The worker pod contract between the NMC controller (which creates worker pods) and whatever runs
// them: a real kubelet with this binary, or the test node agent. A worker pod carries these labels
// and annotations; its single container writes a Result as JSON to its termination message.
const (
	// LabelManagedBy is set to ManagedBy on every pod kmm creates (worker pods of every action,
	// device plugin pods, and any kind of pod kmm adds later); the operator's cache holds only pods
	// with it, and an upgrade drain never touches them (CreatedByKMM).
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is the value of LabelManagedBy.
	ManagedBy = "kmm"
	// LabelWorker marks every worker pod ("true").
	LabelWorker = "kmm.sigs.x-k8s.io/worker"
	// LabelNode is the node the pod runs on (also spec.nodeName).
	LabelNode = "kmm.sigs.x-k8s.io/node"
	// LabelModuleNamespace and LabelModuleName name the Module.
	LabelModuleNamespace = "kmm.sigs.x-k8s.io/module-namespace"
	LabelModuleName      = "kmm.sigs.x-k8s.io/module-name"
	// LabelDevicePlugin marks device plugin DaemonSets and pods ("true"); they also carry
	// LabelModuleNamespace and LabelModuleName.
	LabelDevicePlugin = "kmm.sigs.x-k8s.io/device-plugin"
	// LabelDRA marks DRA driver DaemonSets and pods ("true"); they also carry LabelModuleNamespace
	// and LabelModuleName. The node side counts a DRA driver pod as it counts a device plugin pod
	// (it goes before an unload) and an upgrade drain evicts the draining Module's own.
	LabelDRA = "kmm.sigs.x-k8s.io/dra-driver"
	// LabelValidation marks the validation pods of an automatic rollout ("true"); they also carry
	// LabelModuleNamespace, LabelModuleName, LabelNode and LabelVersion.
	LabelValidation = "kmm.sigs.x-k8s.io/validation"
	// LabelVersion is the Module version a validation pod validates.
	LabelVersion = "kmm.sigs.x-k8s.io/version"
	// LabelAction is the worker pod's Action: "load", "unload" or "reload".
	LabelAction = "kmm.sigs.x-k8s.io/action"
	// AnnotationConfig holds the worker Config as JSON; the downward API mounts it as ConfigFile.
	AnnotationConfig = "kmm.sigs.x-k8s.io/worker-config"
	// AnnotationAttempt is the pair's status attempt the pod was created for (decimal).
	AnnotationAttempt = "kmm.sigs.x-k8s.io/attempt"
	// ContainerName is the name of the worker container.
	ContainerName = "worker"
	// PostLoadHookContainer is the container of a Module's postLoad hook in a load pod (the worker
	// is then the pod's init container).
	PostLoadHookContainer = "post-load-hook"
	// PreUnloadHookContainer is the init container of a Module's preUnload hook in an unload pod.
	PreUnloadHookContainer = "pre-unload-hook"
	// ConfigFile is where the worker container finds its config.
	ConfigFile = "/etc/kmm/config.json"
)

// PodNodeNameField is the cache index of kmm's pods by the node they are bound to; every controller
// that uses it registers it through internal/podindex.
const PodNodeNameField = "spec.nodeName"

// DefaultTimeout bounds a whole worker run: pull, extraction, firmware and modprobe. The operator
// passes it as the worker's --timeout (also the worker's default) and sets the worker pod's
// activeDeadlineSeconds from it plus a margin, so that the worker reports a timed-out Result itself
// before the kubelet kills the pod.
const DefaultTimeout = 4 * time.Minute

// CreatedByKMM says whether an object with these labels is one kmm created: it carries
// LabelManagedBy=ManagedBy. An upgrade drain spares such a pod whatever its podSelector selects
// (but the draining Module's own DRA driver pod, evicted last), so every pod kmm creates, of any
// kind, must carry the label.
func CreatedByKMM(labels map[string]string) bool {
	return labels[LabelManagedBy] == ManagedBy
}
