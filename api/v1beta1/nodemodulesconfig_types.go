package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModuleState is the state of one (node, module) pair in the operator's state machine. The machine
// itself is configured in package fsm; docs/state-diagrams/ shows it.
//
// +kubebuilder:validation:Enum=Absent;Loading;Loaded;Unloading;DevicePluginDraining;Upgrading;LoadBackOff;UnloadBackOff
type ModuleState string

// The states of a (node, module) pair.
const (
	// StateAbsent: the module is not loaded on the node and nothing is in flight.
	StateAbsent ModuleState = "Absent"
	// StateLoading: a load worker pod is wanted or running.
	StateLoading ModuleState = "Loading"
	// StateLoaded: the worker reported a successful load of the config in status.
	StateLoaded ModuleState = "Loaded"
	// StateUnloading: an unload worker pod is wanted or running.
	StateUnloading ModuleState = "Unloading"
	// StateDevicePluginDraining: an ordered upgrade waits for the device plugin pod to leave the node.
	StateDevicePluginDraining ModuleState = "DevicePluginDraining"
	// StateUpgrading: an ordered upgrade unloaded the old version and waits to load the new one.
	StateUpgrading ModuleState = "Upgrading"
	// StateLoadBackOff: a load failed and is retried after an exponential back-off.
	StateLoadBackOff ModuleState = "LoadBackOff"
	// StateUnloadBackOff: an unload failed and is retried after an exponential back-off.
	StateUnloadBackOff ModuleState = "UnloadBackOff"
)

// MaxTransitionLog is how many transitions a status entry keeps; older ones are dropped first.
const MaxTransitionLog = 16

// ModuleConfig is everything a worker needs to load or unload one module on one node. The Module→NMC
// controller resolves it from the Module and the node's kernel; the worker receives it as its config file.
//
// It is atomic for server-side apply: each config has one writer (its Module's field manager in
// spec, the NMC controller in status) and is always written whole, so managedFields name the
// config, not each of its fields (docs/performance.md, "managedFields").
//
// +structType=atomic
type ModuleConfig struct {
	// KernelVersion is the node kernel this config was resolved for.
	// +kubebuilder:validation:MinLength=1
	KernelVersion string `json:"kernelVersion"`

	// ContainerImage is the resolved kmod image (variables substituted).
	// +kubebuilder:validation:MinLength=1
	ContainerImage string `json:"containerImage"`

	// ImagePullPolicy of the kmod image.
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// RegistryTLS says how to reach the registry.
	// +optional
	RegistryTLS TLSOptions `json:"registryTLS,omitempty"`

	// InTreeModulesToRemove are removed before loading.
	// +optional
	InTreeModulesToRemove []string `json:"inTreeModulesToRemove,omitempty"`

	// Modprobe says what to load and how.
	Modprobe ModprobeSpec `json:"modprobe"`

	// Version is the Module's version for ordered upgrades, empty when not used.
	// +optional
	Version string `json:"version,omitempty"`

	// InsecurePull is upstream KMM's record of registryTLS (pull without TLS). kmm never writes it;
	// it is in the schema so that a switch from upstream keeps what upstream recorded (docs/migration.md).
	// +optional
	InsecurePull bool `json:"insecurePull,omitempty"`

	// InTreeModuleToRemove is upstream KMM's older single-module form of InTreeModulesToRemove,
	// kept across a switch from upstream; kmm never writes it.
	// +optional
	InTreeModuleToRemove string `json:"inTreeModuleToRemove,omitempty"`
}

// NodeModuleSpec is one module that should be loaded on the node. Written only by the Module→NMC controller.
type NodeModuleSpec struct {
	// Namespace of the Module.
	Namespace string `json:"namespace"`
	// Name of the Module.
	Name string `json:"name"`

	// Config is what to load.
	Config ModuleConfig `json:"config"`

	// ServiceAccountName of the worker pods.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// ImageRepoSecret is the pull secret, in the Module's namespace.
	// +optional
	ImageRepoSecret *corev1.LocalObjectReference `json:"imageRepoSecret,omitempty"`

	// Tolerations of the worker pods.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Hooks are the Module's hooks (spec.moduleLoader.hooks), run in the worker pods.
	// +optional
	Hooks *ModuleHooks `json:"hooks,omitempty"`

	// Version is upstream KMM's place for the Module's version (kmm keeps it in Config.Version),
	// kept across a switch from upstream; kmm never writes it.
	// +optional
	Version string `json:"version,omitempty"`
}

// NodeModulesConfigSpec is what should be loaded on the node.
type NodeModulesConfigSpec struct {
	// Modules that should be loaded, one entry per Module.
	// +optional
	// +listType=map
	// +listMapKey=namespace
	// +listMapKey=name
	Modules []NodeModuleSpec `json:"modules,omitempty"`
}

// Transition is one entry of a pair's transition log.
type Transition struct {
	// Trigger that caused the transition.
	Trigger string `json:"trigger"`
	// From is the state before.
	From ModuleState `json:"from"`
	// To is the state after.
	To ModuleState `json:"to"`
	// Time of the transition.
	Time metav1.Time `json:"time"`
	// Reason is a short CamelCase explanation.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// NodeModuleStatus is what is true about one module on the node. Written only by the NMC controller.
type NodeModuleStatus struct {
	// Namespace of the Module.
	Namespace string `json:"namespace"`
	// Name of the Module.
	Name string `json:"name"`

	// Config is the config last applied successfully to the node (what is loaded), if any.
	// +optional
	Config *ModuleConfig `json:"config,omitempty"`

	// ServiceAccountName of the worker pods that applied Config; reused to unload it.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// ImageRepoSecret that applied Config; reused to unload it.
	// +optional
	ImageRepoSecret *corev1.LocalObjectReference `json:"imageRepoSecret,omitempty"`

	// Tolerations of the worker pods that applied Config; reused to unload it.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Hooks are the hooks of the spec entry while Config is loaded; the preUnload hook of an
	// unload once the spec entry is gone.
	// +optional
	Hooks *ModuleHooks `json:"hooks,omitempty"`

	// State of the pair. Always set by kmm; empty only in an entry upstream KMM left, which kmm
	// adopts or decides on at first sight (docs/migration.md).
	// +optional
	State ModuleState `json:"state,omitempty"`

	// Reason is a short CamelCase explanation of the state.
	// +optional
	Reason string `json:"reason,omitempty"`

	// Message is a human-readable explanation of the state.
	// +optional
	Message string `json:"message,omitempty"`

	// Attempts counts consecutive failed worker runs; reset on success.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// LastTransitionTime is when State last changed.
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`

	// LastWorkerTime is when a worker pod last finished successfully for this pair; a node Ready
	// transition newer than it means the node may have rebooted.
	// +optional
	LastWorkerTime *metav1.Time `json:"lastWorkerTime,omitempty"`

	// BootID is the node boot ID the worker saw when it loaded Config.
	// +optional
	BootID string `json:"bootID,omitempty"`

	// UpstreamBootID is the boot ID upstream KMM recorded when it loaded Config (its field bootId).
	// kmm reads it once, when it adopts the entry, and never writes it.
	// +optional
	UpstreamBootID string `json:"bootId,omitempty"`

	// Version is upstream KMM's place for the loaded version (kmm keeps it in Config.Version);
	// kmm reads it once, when it adopts the entry, and never writes it.
	// +optional
	Version string `json:"version,omitempty"`

	// ImageDigest is the digest of the kmod image the worker loaded.
	// +optional
	ImageDigest string `json:"imageDigest,omitempty"`

	// Drain records the upgrade drain of the node's workloads for this module, while one is in
	// progress (from DevicePluginDraining until the new version is Loaded).
	// +optional
	Drain *DrainStatus `json:"drain,omitempty"`

	// Transitions is the bounded log of the pair's transitions, oldest first.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Transitions []Transition `json:"transitions,omitempty"`
}

// DrainStatus is the persisted progress of an upgrade drain: a restart or a cordon flap does not
// reset it.
type DrainStatus struct {
	// StartTime is when the drain started; the escalation timeouts count from it.
	StartTime metav1.Time `json:"startTime"`
	// LastStrategy is the strongest strategy run so far: Evict, DeleteNonPDB or ForceDeletePDB.
	// +optional
	LastStrategy string `json:"lastStrategy,omitempty"`
	// CordonedByKMM says the operator cordoned the node for this drain and uncordons it afterwards.
	// +optional
	CordonedByKMM bool `json:"cordonedByKMM,omitempty"`
	// JobWait is what the pair said of the Job pods its drain waits for (upgradePolicy.drain.jobs),
	// each once per drain: Waiting (the WaitingForJobs transition), then Expired (JobWaitExpired).
	// +optional
	JobWait string `json:"jobWait,omitempty"`
}

// NodeModulesConfigStatus is what is true on the node.
type NodeModulesConfigStatus struct {
	// Modules known on the node, one entry per Module (namespace and name unique; the NMC
	// controller, the status's only writer, keeps them so). Atomic: the NMC controller writes the
	// list whole, so managedFields hold one entry for it, not one per field of every Module.
	// +optional
	// +listType=atomic
	Modules []NodeModuleStatus `json:"modules,omitempty"`
}

// NodeModulesConfig is the operator's internal record of one node (same name as the node): the
// modules that should be loaded there and the state of each. Not for users to edit.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nmc
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeModulesConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeModulesConfigSpec   `json:"spec,omitempty"`
	Status NodeModulesConfigStatus `json:"status,omitempty"`
}

// NodeModulesConfigList is a list of NodeModulesConfigs.
//
// +kubebuilder:object:root=true
type NodeModulesConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeModulesConfig `json:"items"`
}
