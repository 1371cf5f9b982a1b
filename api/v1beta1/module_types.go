package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Field names and JSON tags of Module follow the upstream Kernel Module Management v1beta1 Module, so
// that an upstream manifest applies unchanged. Upstream fields that kmm does not implement are declared
// as Unsupported so that the API server rejects them with a message instead of pruning them silently.

// Unsupported is the schema of an upstream field that kmm does not implement. Any value is rejected at
// admission by the CEL rule on the field, with a message naming the feature.
type Unsupported = apiextensionsv1.JSON

// TLSOptions says how to reach an image registry.
type TLSOptions struct {
	// Insecure allows pulling over plain HTTP.
	// +optional
	Insecure bool `json:"insecure,omitempty"`

	// InsecureSkipTLSVerify accepts any certificate the registry presents.
	// +optional
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`
}

// KernelMapping pairs node kernels with a kmod image. Exactly one of Literal, Regexp and VersionRange
// selects the kernels; mappings are tried in order and the first match wins.
//
// +kubebuilder:validation:XValidation:rule="(has(self.literal) && size(self.literal) > 0 ? 1 : 0) + (has(self.regexp) && size(self.regexp) > 0 ? 1 : 0) + (has(self.versionRange) && size(self.versionRange) > 0 ? 1 : 0) == 1",message="exactly one of literal, regexp or versionRange must be set"
type KernelMapping struct {
	// Build builds this mapping's image in the cluster when it does not exist; it overrides the
	// container's build (see docs/api.md for what kmm does with it today).
	// +optional
	Build *Build `json:"build,omitempty"`

	// Sign signs this mapping's modules in the cluster; it overrides the container's sign.
	// +optional
	Sign *Sign `json:"sign,omitempty"`

	// ContainerImage is the kmod image for the kernels this mapping matches. It overrides the
	// container's default and may use the same $KERNEL_* and $MOD_* variables.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ContainerImage string `json:"containerImage,omitempty"`

	// Literal matches one kernel version exactly.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Literal string `json:"literal,omitempty"`

	// Regexp is a Go regular expression matched against the node's kernel version.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Regexp string `json:"regexp,omitempty"`

	// VersionRange (a kmm extension) matches kernels by version, e.g. ">=5.14.0 <6.0"; components
	// compare numerically and the distribution suffix is handled as docs/api.md describes.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	VersionRange string `json:"versionRange,omitempty"`

	// RegistryTLS overrides the container's registry TLS settings for this mapping.
	// +optional
	RegistryTLS *TLSOptions `json:"registryTLS,omitempty"`

	// InTreeModuleToRemove is upstream's deprecated single-module form of InTreeModulesToRemove.
	// +optional
	InTreeModuleToRemove string `json:"inTreeModuleToRemove,omitempty"`

	// InTreeModulesToRemove are in-tree modules removed (if loaded) before this mapping's module loads.
	// +optional
	// +listType=set
	InTreeModulesToRemove []string `json:"inTreeModulesToRemove,omitempty"`
}

// ModprobeArgs are extra modprobe arguments for loading and unloading.
type ModprobeArgs struct {
	// Load are the arguments used when loading.
	// +kubebuilder:validation:MinItems=1
	// +optional
	Load []string `json:"load,omitempty"`

	// Unload are the arguments used when unloading.
	// +kubebuilder:validation:MinItems=1
	// +optional
	Unload []string `json:"unload,omitempty"`
}

// ModprobeSpec says which module modprobe loads and how. Its cross-field rules sit on
// ModuleLoaderContainerSpec, so that the internal NodeModulesConfig can reuse the type without them.
type ModprobeSpec struct {
	// ModuleName is the kernel module to load.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ModuleName string `json:"moduleName,omitempty"`

	// Parameters are key=value module parameters appended to the load command.
	// +optional
	Parameters []string `json:"parameters,omitempty"`

	// DirName is the directory inside the kmod image that holds lib/modules (modprobe -d).
	// +kubebuilder:default=/opt
	// +optional
	DirName string `json:"dirName,omitempty"`

	// Args are passed to modprobe before the module name.
	// +optional
	Args *ModprobeArgs `json:"args,omitempty"`

	// RawArgs, when set, are passed to modprobe as they are; the other fields are ignored for the command.
	// +optional
	RawArgs *ModprobeArgs `json:"rawArgs,omitempty"`

	// FirmwarePath is the directory inside the kmod image whose files are copied to the host's firmware
	// lookup path. Setting it makes the worker pod privileged.
	// +optional
	FirmwarePath string `json:"firmwarePath,omitempty"`

	// ModulesLoadingOrder lists modules that depend on each other without depmod knowing: the first
	// entry is ModuleName, each next one is loaded before the previous one, and unloading removes them all.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	ModulesLoadingOrder []string `json:"modulesLoadingOrder,omitempty"`
}

// ModuleLoaderContainerSpec says which image to load on which kernel and how.
//
// +kubebuilder:validation:XValidation:rule="(has(self.modprobe.moduleName) && size(self.modprobe.moduleName) > 0) || has(self.modprobe.rawArgs)",message="moduleName is required unless rawArgs is set",fieldPath=".modprobe.moduleName"
// +kubebuilder:validation:XValidation:rule="!has(self.modprobe.modulesLoadingOrder) || size(self.modprobe.modulesLoadingOrder) == 0 || (has(self.modprobe.moduleName) && self.modprobe.modulesLoadingOrder[0] == self.modprobe.moduleName)",message="the first entry of modulesLoadingOrder must equal moduleName",fieldPath=".modprobe.modulesLoadingOrder"
// +kubebuilder:validation:XValidation:rule="(has(self.containerImage) && size(self.containerImage) > 0) || self.kernelMappings.all(m, has(m.containerImage) && size(m.containerImage) > 0)",message="every kernelMapping needs a containerImage when container.containerImage is not set"
// +kubebuilder:validation:XValidation:rule="(has(oldSelf.version) && size(oldSelf.version) > 0) == (has(self.version) && size(self.version) > 0)",message="version cannot be added to or removed from an existing Module: delete and recreate the Module",fieldPath=".version"
// +kubebuilder:validation:XValidation:rule="!has(self.modprobe.rawArgs) || (has(self.modprobe.rawArgs.load) && has(self.modprobe.rawArgs.unload))",message="rawArgs needs both load and unload: without unload arguments the module could never be unloaded",fieldPath=".modprobe.rawArgs"
type ModuleLoaderContainerSpec struct {
	// Build is the default in-cluster build of every mapping's image (see docs/api.md for what kmm
	// does with it today).
	// +optional
	Build *Build `json:"build,omitempty"`

	// Sign is the default in-cluster signing of every mapping's modules.
	// +optional
	Sign *Sign `json:"sign,omitempty"`

	// Version is the version of the module for ordered upgrades (see docs/api.md). Once set it cannot
	// be removed, and it cannot be added to a Module created without it.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Version string `json:"version,omitempty"`

	// ContainerImage is the default kmod image. It may use $KERNEL_FULL_VERSION, $KERNEL_VERSION,
	// $KERNEL_XYZ, $KERNEL_X, $KERNEL_Y, $KERNEL_Z, $MOD_NAME and $MOD_NAMESPACE.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ContainerImage string `json:"containerImage,omitempty"`

	// ImagePullPolicy of the kmod image: Always pulls even when the digest-keyed cache has a copy.
	// A CEL rule rather than an enum: a schema error would stop the CEL rules, and the API server
	// would add "some validation rules were not checked" to the user's message.
	// +kubebuilder:validation:XValidation:rule="self in ['Always', 'IfNotPresent', 'Never']",message="imagePullPolicy must be Always, IfNotPresent or Never"
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// KernelMappings are tried in order against the node's kernel version; the first match wins.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	KernelMappings []KernelMapping `json:"kernelMappings"`

	// Modprobe says which module to load and how.
	Modprobe ModprobeSpec `json:"modprobe"`

	// RegistryTLS says how to reach the kmod image registry.
	// +optional
	RegistryTLS TLSOptions `json:"registryTLS,omitempty"`

	// InTreeModuleToRemove is upstream's deprecated single-module form of InTreeModulesToRemove.
	// +optional
	InTreeModuleToRemove string `json:"inTreeModuleToRemove,omitempty"`

	// InTreeModulesToRemove are in-tree modules removed (if loaded) before the module loads.
	// +optional
	// +listType=set
	InTreeModulesToRemove []string `json:"inTreeModulesToRemove,omitempty"`
}

// ModuleLoaderSpec configures the worker pods that load and unload the module.
type ModuleLoaderSpec struct {
	// Container holds what the worker needs to load the module.
	Container ModuleLoaderContainerSpec `json:"container"`

	// ServiceAccountName of the worker pods. The worker needs no API access; its token is never mounted.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Hooks (a kmm extension) are containers kmm runs in the worker pod, on the node: postLoad
	// after each load, preUnload before each unload. Absent: no hooks (upstream's behaviour).
	// +optional
	Hooks *ModuleHooks `json:"hooks,omitempty"`
}

// ModuleHooks are the containers run around the worker (docs/api.md#hooks). A failed hook fails
// the worker pod's attempt with its own reason (PostLoadHookFailed, PreUnloadHookFailed) and backs
// off; a failed preUnload hook keeps the module loaded (the unload never runs).
type ModuleHooks struct {
	// PostLoad runs after the worker loaded the module, in the same pod (the worker is then the
	// pod's init container). The node counts as Loaded, and gets the module's ready label, only
	// once it exited 0.
	// +optional
	PostLoad *ModuleHook `json:"postLoad,omitempty"`

	// PreUnload runs before the worker unloads the module, as the pod's init container: the
	// worker runs only once it exited 0 (e.g. after it unbound the module's devices, without
	// which modprobe -r fails with EBUSY).
	// +optional
	PreUnload *ModuleHook `json:"preUnload,omitempty"`
}

// ModuleHook is one hook container. It runs in the worker pod, so on the worker's node, in the
// Module's namespace, with the worker's service account, tolerations and pull settings of the
// kubelet (imageRepoSecret is the pod's imagePullSecret), with no API token; as root with the
// worker's capabilities (CAP_SYS_MODULE only), the runtime's default seccomp profile and a
// read-only root file system, unless Privileged. It sees the node's /lib/modules read-only and
// the pod's /tmp, shared with the worker, and the host paths it names.
type ModuleHook struct {
	// Image of the hook container, pulled by the kubelet (with the Module's imageRepoSecret).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image"`

	// Command overrides the image's entrypoint.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	Command []string `json:"command,omitempty"`

	// Args overrides the image's command.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=4096
	Args []string `json:"args,omitempty"`

	// Env are environment variables of the hook (kmm adds KMM_NODE_NAME, KMM_MODULE_NAME,
	// KMM_KERNEL_VERSION and KMM_MODULE_VERSION before them).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Env []corev1.EnvVar `json:"env,omitempty"`

	// ImagePullPolicy of the image.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the hook container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// Privileged runs the hook as a privileged container (e.g. to write sysfs).
	// +optional
	Privileged bool `json:"privileged,omitempty"`

	// HostPaths are node directories mounted read-write into the hook at the same path: under
	// /dev, /sys, /var, /opt or /run (the device plugin's prefixes), no "." or ".." segment.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^/(dev|sys|var|opt|run)(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))*$`
	// +listType=set
	HostPaths []string `json:"hostPaths,omitempty"`
}

// DevicePluginContainerSpec is the device plugin container.
type DevicePluginContainerSpec struct {
	// Command overrides the image's entrypoint.
	// +optional
	Command []string `json:"command,omitempty"`

	// Args overrides the image's command.
	// +optional
	Args []string `json:"args,omitempty"`

	// Env are environment variables of the container.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`

	// Image of the device plugin.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`

	// ImagePullPolicy of the device plugin image.
	// +kubebuilder:validation:XValidation:rule="self in ['Always', 'IfNotPresent', 'Never']",message="imagePullPolicy must be Always, IfNotPresent or Never"
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// VolumeMounts are added to the default ones.
	// +optional
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`

	// StartupProbe of the container.
	// +optional
	StartupProbe *corev1.Probe `json:"startupProbe,omitempty"`

	// LivenessProbe of the container.
	// +optional
	LivenessProbe *corev1.Probe `json:"livenessProbe,omitempty"`
}

// DevicePluginSpec is the device plugin that kmm runs as a DaemonSet on nodes where the module is loaded.
type DevicePluginSpec struct {
	// Container is the device plugin container.
	Container DevicePluginContainerSpec `json:"container"`

	// InitContainer runs before the device plugin container.
	// +optional
	InitContainer *DevicePluginContainerSpec `json:"initContainer,omitempty"`

	// ServiceAccountName of the device plugin pods.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Volumes of the device plugin pods. Device plugin pods run privileged, so a hostPath volume may
	// only name a directory under /dev, /sys, /var, /opt or /run (DevicePluginHostPathPrefixes); at
	// most 16 volumes (the bound keeps the CEL rule within its cost budget).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(v, !has(v.hostPath) || (!v.hostPath.path.contains('..') && ['/dev', '/sys', '/var', '/opt', '/run'].exists(p, v.hostPath.path == p || v.hostPath.path.startsWith(p + '/'))))",message="a device plugin may mount host paths only under /dev, /sys, /var, /opt or /run, without '..'"
	Volumes []corev1.Volume `json:"volumes,omitempty"`

	// AutomountServiceAccountToken set to false keeps the service account token out of the pods.
	// +optional
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
}

// DeviceClassSpec is a cluster-scoped resource.k8s.io/v1 DeviceClass that kmm keeps for the Module.
type DeviceClassSpec struct {
	// Name is the DeviceClass's metadata.name (a DNS subdomain).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// Selectors restrict which devices satisfy the class.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Selectors []resourcev1.DeviceSelector `json:"selectors,omitempty"`

	// Config is per-device configuration given to the DRA driver.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Config []resourcev1.DeviceClassConfiguration `json:"config,omitempty"`
}

// DRASpec is the Dynamic Resource Allocation driver that kmm runs as a DaemonSet where the module is
// loaded (on every selected node for a Module without moduleLoader), with the Module's DeviceClasses.
type DRASpec struct {
	// Container is the DRA driver container.
	Container DevicePluginContainerSpec `json:"container"`

	// InitContainer runs before the DRA driver container.
	// +optional
	InitContainer *DevicePluginContainerSpec `json:"initContainer,omitempty"`

	// ServiceAccountName of the DRA driver pods (a driver publishes ResourceSlices: its account
	// needs that right).
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// Volumes of the DRA driver pods, with the same host path rule as a device plugin's.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(v, !has(v.hostPath) || (!v.hostPath.path.contains('..') && ['/dev', '/sys', '/var', '/opt', '/run'].exists(p, v.hostPath.path == p || v.hostPath.path.startsWith(p + '/'))))",message="a DRA driver may mount host paths only under /dev, /sys, /var, /opt or /run, without '..'"
	Volumes []corev1.Volume `json:"volumes,omitempty"`

	// AutomountServiceAccountToken set to false keeps the service account token out of the pods.
	// +optional
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`

	// DriverName is the name the driver registers with the kubelet and writes into the allocations
	// of ResourceClaims (a DNS subdomain of at most 63 characters, as resource.k8s.io bounds it).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	DriverName string `json:"driverName"`

	// DeviceClasses are kept as the Module says: created, updated, and deleted when they leave
	// this list or the Module goes.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	DeviceClasses []DeviceClassSpec `json:"deviceClasses,omitempty"`
}

// DrainSpec (a kmm extension) drains the workloads that use the module from a node before the module
// is unloaded for an upgrade, escalating as the timeouts pass (see docs/api.md).
type DrainSpec struct {
	// PodSelector selects the workload pods to drain.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`

	// TimeoutSeconds after the drain started, remaining pods not covered by a PodDisruptionBudget are
	// deleted and finalizers of stuck pods are removed.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=300
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// PDBForceDrainTimeoutSeconds after the drain started, pods protected by a PodDisruptionBudget
	// are deleted too.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=900
	// +optional
	PDBForceDrainTimeoutSeconds int32 `json:"pdbForceDrainTimeoutSeconds,omitempty"`

	// ExpectedDrainSeconds is the best-case time a drain takes (seed 004's expected node drain
	// time): pods protected by a PodDisruptionBudget are deleted only ExpectedDrainSeconds +
	// PDBForceDrainTimeoutSeconds after the drain started.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ExpectedDrainSeconds int32 `json:"expectedDrainSeconds,omitempty"`

	// IgnoredNamespacePatterns are Go regular expressions; pods in matching namespaces are never
	// subject to the escalating strategies.
	// +optional
	IgnoredNamespacePatterns []string `json:"ignoredNamespacePatterns,omitempty"`

	// DisableDrainStrategies keeps to eviction only: nothing is force-deleted.
	// +optional
	DisableDrainStrategies bool `json:"disableDrainStrategies,omitempty"`

	// DeviceUsers (a kmm extension) drains, besides the pods podSelector selects, the pods on the
	// node that use the Module's devices. With deviceUsers and no podSelector, only those pods are
	// drained (without deviceUsers, no podSelector selects every pod on the node).
	// +optional
	DeviceUsers *DrainDeviceUsers `json:"deviceUsers,omitempty"`

	// Jobs (a kmm extension) waits for the pods that Jobs control instead of evicting them, at most
	// waitSeconds after the drain started; past it they are drained as the other pods are, the
	// strategies escalating from the wait's end.
	// +optional
	Jobs *DrainJobs `json:"jobs,omitempty"`
}

// DrainDeviceUsers says which pods on a node use the Module's devices (docs/api.md, Upgrade drain).
// +kubebuilder:validation:XValidation:rule="(has(self.extendedResources) && size(self.extendedResources) > 0) || (has(self.resourceClaims) && self.resourceClaims)",message="deviceUsers must list extendedResources or set resourceClaims"
type DrainDeviceUsers struct {
	// ExtendedResources are the resource names the Module's device plugin advertises (such as
	// example.com/gpu): a pod on the node that requests or limits one of them, in any container,
	// is drained. kmm does not guess them from the node's allocatable (which does not say which
	// plugin registered a name): the Module lists them. At most 16.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	ExtendedResources []string `json:"extendedResources,omitempty"`

	// ResourceClaims drains the pods on the node that a ResourceClaim allocated there with devices
	// of the Module's DRA driver (spec.dra.driverName: what its DeviceClasses select) is reserved
	// for or named by. Selects nothing for a Module without spec.dra.
	// +optional
	ResourceClaims bool `json:"resourceClaims,omitempty"`
}

// DrainJobs is how a drain treats the pods that Jobs control.
type DrainJobs struct {
	// WaitSeconds after the drain started, the Job pods still on the node are drained as the other
	// pods: evicted, then, as the timeouts pass again from the wait's end, deleted (see docs/api.md).
	// At least 1, at most 1 day.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	// +kubebuilder:default=3600
	// +optional
	WaitSeconds int32 `json:"waitSeconds,omitempty"`
}

// UpgradePolicy (a kmm extension) says how a version change of the Module rolls out. Absent means
// manual, as upstream: the administrator moves the version-module label node by node.
type UpgradePolicy struct {
	// Automatic lets the operator move the version-module label itself, node by node.
	// +optional
	Automatic bool `json:"automatic,omitempty"`

	// MaxUnavailable is how many nodes (a number, or a percentage of the selected nodes) may be
	// upgrading at once; nodes already cordoned or NotReady count against it.
	// +kubebuilder:validation:XIntOrString
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// Drain drains the workloads that use the module before each unload.
	// +optional
	Drain *DrainSpec `json:"drain,omitempty"`

	// Paused (kubectl kmm rollout pause) starts no more nodes; nodes already upgrading finish.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// MaxFailed is the failure budget: once this many managed nodes (a number, or a percentage of
	// them, rounded down but at least 1) are UpgradeFailed, the rollout pauses itself until the user
	// resumes it (the rollout-resume annotation, kubectl kmm rollout resume). Absent: it never
	// pauses itself.
	// +kubebuilder:validation:XIntOrString
	// +optional
	MaxFailed *intstr.IntOrString `json:"maxFailed,omitempty"`

	// Validation is a pod kmm runs on each node once the new version is loaded there (and its
	// device plugin or DRA driver pod is Ready): the node counts as Upgraded, and stops counting
	// against maxUnavailable, only once it succeeded. Absent: no validation pod.
	// +optional
	Validation *ValidationSpec `json:"validation,omitempty"`

	// NodeTimeoutSeconds: a node whose pair stays this long in one state of its upgrade (any state
	// but Loaded with another version than the node's label) is UpgradeFailed. 0 or absent: no
	// timeout. At most 7 days.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=604800
	// +optional
	NodeTimeoutSeconds int32 `json:"nodeTimeoutSeconds,omitempty"`

	// RollbackFailed: while the rollout is paused (at its failure budget or by the user), its
	// UpgradeFailed nodes go back to the previous version (status.rollout.previous) through the
	// same ordered path (the new version unloaded, then the previous one loaded). Absent or false:
	// failed nodes stay as they are.
	// +optional
	RollbackFailed bool `json:"rollbackFailed,omitempty"`

	// Canary chooses the first nodes to move; the others wait until those have run the new version
	// for soakSeconds. Absent: every node may start as soon as maxUnavailable allows.
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`
}

// MaxCanaryNodes bounds the canary nodes of a rollout (CanarySpec.Count, CanaryStatus.Nodes).
const MaxCanaryNodes = 32

// CanarySpec chooses the canary nodes of an automatic rollout and how long they soak.
type CanarySpec struct {
	// NodeSelector picks the canary nodes among the managed nodes (those the Module selects, not
	// skipped): the first count of those it matches, by name. Absent: the first count managed nodes.
	// +kubebuilder:validation:MaxProperties=16
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Count is how many canary nodes, at most 32. 0 or absent: 1 without nodeSelector, every node
	// it matches (at most 32) with it.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	// +optional
	Count int32 `json:"count,omitempty"`

	// SoakSeconds is how long every canary node must have been Upgraded (together, without a break)
	// before the other nodes start. At most 7 days; 0: the others start once the canaries are Upgraded.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=604800
	// +optional
	SoakSeconds int32 `json:"soakSeconds,omitempty"`
}

// ValidationSpec is the validation pod of an automatic rollout: one container, run once per node
// and version, in the Module's namespace on that node (restartPolicy Never).
type ValidationSpec struct {
	// Container is the validation container; it succeeds by exiting 0. On failure, its termination
	// message (or the tail of its log) is the reason's message.
	Container ValidationContainerSpec `json:"container"`

	// ServiceAccountName of the validation pod (default: the namespace's default account).
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// TimeoutSeconds bounds the pod's run (its activeDeadlineSeconds): past it the pod fails and
	// the node is UpgradeFailed (ValidationFailed).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +kubebuilder:default=600
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// ValidationContainerSpec is the container of a validation pod.
type ValidationContainerSpec struct {
	// Image of the container.
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`

	// Command overrides the image's entrypoint.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Command []string `json:"command,omitempty"`

	// Args overrides the image's command.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Args []string `json:"args,omitempty"`

	// Env are environment variables of the container (the operator adds KMM_NODE_NAME,
	// KMM_MODULE_VERSION).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Env []corev1.EnvVar `json:"env,omitempty"`

	// ImagePullPolicy of the image.
	// +kubebuilder:validation:XValidation:rule="self in ['Always', 'IfNotPresent', 'Never']",message="imagePullPolicy must be Always, IfNotPresent or Never"
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// UpgradeState is where one selected node is in the automatic rollout of its Module.
type UpgradeState string

// The upgrade states of a node (RolloutStatus.NodesByUpgradeState, RolloutNodeStatus.State).
const (
	// UpgradePending: the node has not started towards the Module's version.
	UpgradePending UpgradeState = "UpgradePending"
	// Upgrading: the node's version-module label names the Module's version and its pair is on
	// its way there.
	Upgrading UpgradeState = "Upgrading"
	// Upgraded: the node runs the Module's version (its pair is Loaded with it).
	Upgraded UpgradeState = "Upgraded"
	// UpgradeFailed: the node's load or unload failed (its pair backs off), its drain ran every
	// strategy and pods remain, or its pair stayed in one state longer than nodeTimeoutSeconds.
	UpgradeFailed UpgradeState = "UpgradeFailed"
	// UpgradeSkipped: the node carries the upgrade-skip label.
	UpgradeSkipped UpgradeState = "UpgradeSkipped"
	// RollingBack: the node is on its way back to the previous version (status.rollout.rollback).
	RollingBack UpgradeState = "RollingBack"
	// RolledBack: the node runs the previous version again (its pair is Loaded with it) while the
	// rollback lasts.
	RolledBack UpgradeState = "RolledBack"
	// CanaryWaiting: a node that is not a canary and waits for the canaries to soak.
	CanaryWaiting UpgradeState = "CanaryWaiting"
)

// Reasons of a paused rollout (RolloutPause.Reason) and of an UpgradeFailed node.
const (
	// ReasonFailureBudgetExceeded: maxFailed nodes failed; the rollout waits for the user.
	ReasonFailureBudgetExceeded = "FailureBudgetExceeded"
	// ReasonPausedByUser: spec.upgradePolicy.paused is true.
	ReasonPausedByUser = "PausedByUser"
	// ReasonUpgradeTimedOut: the node's pair stayed in one state longer than nodeTimeoutSeconds.
	ReasonUpgradeTimedOut = "UpgradeTimedOut"
	// ReasonDrainTimedOut: every drain strategy ran and workload pods remain on the node.
	ReasonDrainTimedOut = "DrainTimedOut"
	// ReasonValidationFailed: the node's validation pod failed (or ran past its timeout).
	ReasonValidationFailed = "ValidationFailed"
	// ReasonDevicePluginNotReady: the new version is loaded, its device plugin (or DRA driver)
	// pod is not Ready on the node yet (an Upgrading node's reason).
	ReasonDevicePluginNotReady = "DevicePluginNotReady"
	// ReasonValidating: the new version is loaded and the node's validation pod has not
	// succeeded yet (an Upgrading node's reason).
	ReasonValidating = "Validating"
	// ReasonRollbackFailedNodes: upgradePolicy.rollbackFailed moves a paused rollout's failed nodes
	// back (RolloutRollback.Reason).
	ReasonRollbackFailedNodes = "FailedNodes"
	// ReasonRollbackUndo: kubectl kmm rollout undo (the rollout-undo annotation) moves every node
	// back (RolloutRollback.Reason).
	ReasonRollbackUndo = "Undo"
	// ReasonNoPreviousConfig: a node to roll back runs a kernel status.rollout.previous has no
	// config for; it stays where it is.
	ReasonNoPreviousConfig = "NoPreviousConfig"
)

// MaxPreviousConfigs bounds PreviousVersion.Configs: one config per kernel.
const MaxPreviousConfigs = 8

// MaxRollbackNodes bounds RolloutRollback.Nodes.
const MaxRollbackNodes = 256

// MaxRolloutNodesListed bounds RolloutStatus.Nodes: failed nodes first, then upgrading ones, by
// name.
const MaxRolloutNodesListed = 32

// RolloutStatus (a kmm extension) is the automatic rollout of spec.upgradePolicy as its controller
// last saw it; absent for a Module without upgradePolicy.automatic.
type RolloutStatus struct {
	// Version is the version being rolled out.
	Version string `json:"version"`

	// NodesByUpgradeState counts the selected nodes per upgrade state.
	// +optional
	NodesByUpgradeState map[UpgradeState]int32 `json:"nodesByUpgradeState,omitempty"`

	// MaxUnavailable is upgradePolicy.maxUnavailable resolved against the managed nodes.
	MaxUnavailable int32 `json:"maxUnavailable"`

	// MaxFailed is upgradePolicy.maxFailed resolved against the managed nodes (0: no budget).
	// +optional
	MaxFailed int32 `json:"maxFailed,omitempty"`

	// FailedAtResume is how many nodes were UpgradeFailed when the user last resumed the rollout
	// of this version: the budget counts the failed nodes beyond them.
	// +optional
	FailedAtResume int32 `json:"failedAtResume,omitempty"`

	// ObservedResume is the value of the rollout-resume annotation the controller last acted on.
	// +optional
	ObservedResume string `json:"observedResume,omitempty"`

	// Paused is set while the rollout starts no node: by the user, or by itself at the budget.
	// +optional
	Paused *RolloutPause `json:"paused,omitempty"`

	// Nodes lists the UpgradeFailed nodes, then the Upgrading ones, each by name, at most
	// MaxRolloutNodesListed (32).
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Nodes []RolloutNodeStatus `json:"nodes,omitempty"`

	// Canary is the canary of this version's rollout (upgradePolicy.canary).
	// +optional
	Canary *CanaryStatus `json:"canary,omitempty"`

	// Previous is the version the nodes ran before this rollout and the configs they ran it with:
	// what a rollback loads again.
	// +optional
	Previous *PreviousVersion `json:"previous,omitempty"`

	// Rollback is set while nodes go back to the previous version.
	// +optional
	Rollback *RolloutRollback `json:"rollback,omitempty"`

	// ObservedUndo is the value of the rollout-undo annotation the controller last acted on.
	// +optional
	ObservedUndo string `json:"observedUndo,omitempty"`
}

// CanaryStatus is the canary of a rollout.
type CanaryStatus struct {
	// Nodes are the canary nodes, chosen when the version's rollout started, at most 32.
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Nodes []string `json:"nodes,omitempty"`
	// SoakStart is when every canary node was last seen Upgraded together (nil while one is not).
	// +optional
	SoakStart *metav1.Time `json:"soakStart,omitempty"`
	// Passed: the canaries soaked for soakSeconds; the other nodes move.
	// +optional
	Passed bool `json:"passed,omitempty"`
}

// PreviousVersion is the version before a rollout with the configs its nodes ran, as their NMC
// statuses recorded them.
type PreviousVersion struct {
	// Version is the previous version.
	Version string `json:"version"`
	// Configs are the configs the nodes ran the previous version with, one per kernel, at most 8.
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Configs []PreviousConfig `json:"configs,omitempty"`
}

// PreviousConfig is one kernel's config of the previous version and the worker pod settings that
// loaded it.
type PreviousConfig struct {
	// Config is what was loaded (its kernelVersion names the kernel).
	Config ModuleConfig `json:"config"`
	// ServiceAccountName of the worker pods that loaded it.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// ImageRepoSecret that loaded it.
	// +optional
	ImageRepoSecret *corev1.LocalObjectReference `json:"imageRepoSecret,omitempty"`
	// Tolerations of the worker pods that loaded it.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// RolloutRollback is a rollback in progress: nodes going back to the previous version.
type RolloutRollback struct {
	// Version is the version the nodes go back to.
	Version string `json:"version"`
	// Reason is FailedNodes (upgradePolicy.rollbackFailed, while paused) or Undo (kubectl kmm
	// rollout undo: every node).
	Reason string `json:"reason"`
	// Since is when the rollback started.
	Since metav1.Time `json:"since"`
	// Nodes are the nodes going back (FailedNodes), at most 256; empty for Undo (every node).
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Nodes []string `json:"nodes,omitempty"`
}

// RolloutPause says why and since when a rollout starts no node.
type RolloutPause struct {
	// Reason is FailureBudgetExceeded or PausedByUser.
	Reason string `json:"reason"`
	// Message explains it (the failed nodes, and what to do).
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when the rollout paused.
	Since metav1.Time `json:"since"`
}

// RolloutNodeStatus is one node of a rollout that is not pending, upgraded or skipped.
type RolloutNodeStatus struct {
	// Name of the node.
	Name string `json:"name"`
	// State is Upgrading or UpgradeFailed.
	State UpgradeState `json:"state"`
	// PairState is the state of the node's (node, Module) pair.
	// +optional
	PairState ModuleState `json:"pairState,omitempty"`
	// Reason is the failure's reason (the pair's, UpgradeTimedOut or DrainTimedOut), or the pair's
	// last reason while upgrading.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message explains the reason.
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when the pair entered its state.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// ModuleSpec says which kmod to load on which nodes.
// +kubebuilder:validation:XValidation:rule="has(self.moduleLoader) || has(self.devicePlugin) || has(self.dra)",message="moduleLoader is required unless devicePlugin or dra is set (a device-plugin-only Module)",fieldPath=".moduleLoader"
// +kubebuilder:validation:XValidation:rule="!(has(self.dra) && has(self.devicePlugin))",message="spec.dra and spec.devicePlugin are mutually exclusive"
type ModuleSpec struct {
	// DevicePlugin, when set, runs on every node where the module is loaded (on every selected node
	// for a device-plugin-only Module, one without moduleLoader).
	// +optional
	DevicePlugin *DevicePluginSpec `json:"devicePlugin,omitempty"`

	// DRA, when set, runs a Dynamic Resource Allocation driver wherever a device plugin would run,
	// and keeps the Module's DeviceClasses. Mutually exclusive with devicePlugin.
	// +optional
	DRA *DRASpec `json:"dra,omitempty"`

	// ModuleLoader says how to load the module. Without it the Module is device-plugin-only: nothing
	// is loaded, and the device plugin runs on every node the selector matches.
	// +optional
	ModuleLoader *ModuleLoaderSpec `json:"moduleLoader,omitempty"`

	// ImageRepoSecret is a docker-config Secret in the Module's namespace used to pull the kmod and
	// device plugin images.
	// +optional
	ImageRepoSecret *corev1.LocalObjectReference `json:"imageRepoSecret,omitempty"`

	// Selector selects the nodes that need the module. It must not be empty.
	// +kubebuilder:validation:XValidation:rule="size(self) > 0",message="selector must not be empty: name the node labels of the nodes that need the module"
	Selector map[string]string `json:"selector"`

	// Tolerations of the worker and device plugin pods.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// ImageRebuildTriggerGeneration, when changed (or set), has every image of the Module checked
	// in its registry again and built (and signed) if it is missing.
	// +optional
	ImageRebuildTriggerGeneration *int64 `json:"imageRebuildTriggerGeneration,omitempty"`

	// UpgradePolicy (a kmm extension) says how version changes roll out. Absent means manual.
	// +optional
	UpgradePolicy *UpgradePolicy `json:"upgradePolicy,omitempty"`
}

// DaemonSetStatus counts nodes, as upstream reports them.
type DaemonSetStatus struct {
	// NodesMatchingSelectorNumber is the number of nodes the selector matches.
	NodesMatchingSelectorNumber int32 `json:"nodesMatchingSelectorNumber,omitempty"`
	// DesiredNumber is the number of nodes that should run the module (or device plugin).
	DesiredNumber int32 `json:"desiredNumber,omitempty"`
	// AvailableNumber is the number of nodes where it is loaded (or running).
	AvailableNumber int32 `json:"availableNumber,omitempty"`
}

// ModuleStatus is what the operator observed about a Module across nodes.
type ModuleStatus struct {
	// ModuleLoader counts nodes for the module itself.
	// +optional
	ModuleLoader DaemonSetStatus `json:"moduleLoader,omitempty"`

	// DevicePlugin counts nodes for the device plugin.
	// +optional
	DevicePlugin DaemonSetStatus `json:"devicePlugin,omitempty"`

	// DRA counts nodes for the DRA driver.
	// +optional
	DRA DaemonSetStatus `json:"dra,omitempty"`

	// NodesByState counts the selected nodes per state of the (node, module) state machine.
	// +optional
	NodesByState map[ModuleState]int32 `json:"nodesByState,omitempty"`

	// ObservedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Rollout (a kmm extension) is the automatic rollout's progress, budget and pause, written by
	// the rollout controller only.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`

	// Conditions are Ready, Progressing and Degraded (see docs/api.md for their reasons).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Module is a kernel module that should be loaded on the nodes its selector matches.
//
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40",message="metadata.name may have at most 40 characters: len(namespace)+len(name) must be at most 41 because both go into node label keys"
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.moduleLoader.desiredNumber`
// +kubebuilder:printcolumn:name="Loaded",type=integer,JSONPath=`.status.moduleLoader.availableNumber`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Module struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ModuleSpec   `json:"spec,omitempty"`
	Status ModuleStatus `json:"status,omitempty"`
}

// ModuleList is a list of Modules.
//
// +kubebuilder:object:root=true
type ModuleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Module `json:"items"`
}

// Version is the module version for ordered upgrades (moduleLoader.container.version; "" for a
// Module without one or without a module loader).
func (s *ModuleSpec) Version() string {
	if s.ModuleLoader == nil {
		return ""
	}
	return s.ModuleLoader.Container.Version
}

// DevicePluginOnly says whether the Module loads nothing and runs only its device plugin or DRA
// driver (on every selected node).
func (s *ModuleSpec) DevicePluginOnly() bool {
	return s.ModuleLoader == nil
}
