package v1beta1

// Condition types of Module.status.conditions. Each is True when what its name says holds.
const (
	// ConditionReady is True when the module is loaded (with the spec config) on every node that
	// needs it and no pair is failing.
	ConditionReady = "Ready"
	// ConditionProgressing is True while at least one pair is loading, unloading or upgrading.
	ConditionProgressing = "Progressing"
	// ConditionDegraded is True when the Module is invalid, a node has no matching kernel mapping, or
	// a worker keeps failing; its reason says which.
	ConditionDegraded = "Degraded"
)

// Reasons of Module conditions.
const (
	// ReasonAllLoaded: every selected node has the module loaded.
	ReasonAllLoaded = "AllLoaded"
	// ReasonInProgress: some pairs are still converging.
	ReasonInProgress = "InProgress"
	// ReasonInvalidSpec: the Module fails validation (it got past admission); nothing is done for it.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonNoKernelMapping: a selected node runs a kernel that no kernel mapping matches.
	ReasonNoKernelMapping = "NoKernelMapping"
	// ReasonWorkerFailing: a worker pod failed on at least one node and is being retried.
	ReasonWorkerFailing = "WorkerFailing"
	// ReasonObjectRefused: the API server refused an object kmm derives from the Module (an NMC
	// entry, the device plugin DaemonSet) for what it is (invalid, forbidden, too large); the
	// message quotes it. Retried on every change, with back-off.
	ReasonObjectRefused = "ObjectRefused"
	// ReasonDevicePluginHandoverStuck: after a takeover from upstream KMM, kmm's device plugin has not
	// been Ready, for longer than the handover timeout, on some node upstream KMM's device plugin
	// serves (the message names them); upstream's DaemonSet is kept until it is.
	ReasonDevicePluginHandoverStuck = "DevicePluginHandoverStuck"
	// ReasonNamespaceTerminating: the Module's namespace is being deleted (its deletion got past the
	// namespace guard: the webhook was down or off). No worker pod can be created there any more, so
	// the module can be neither unloaded nor loaded; the message names the nodes that still have it.
	ReasonNamespaceTerminating = "NamespaceTerminating"
	// ReasonImageNotReady: some nodes wait for an image the cluster builds or signs (Module
	// build/sign, docs/build.md): no worker starts for them until the image is Present in its
	// registry; the message names each such image and its state.
	ReasonImageNotReady = "ImageNotReady"
	// ReasonImageFailing: the build or sign of an image some nodes wait for failed and is retried
	// after a back-off; the message quotes the failure (the tail of the build log).
	ReasonImageFailing = "ImageFailing"
	// ReasonAsExpected: nothing is wrong.
	ReasonAsExpected = "AsExpected"
)
