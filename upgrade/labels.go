package upgrade

// NodeLabels are the version labels of one (node, Module); "" means the label is absent.
type NodeLabels struct {
	// Target is the user's kmm.node.kubernetes.io/version-module.<ns>.<name> label.
	Target string
	// WorkerPod is beta.kmm.node.kubernetes.io/version-worker-pod.<ns>.<name>.
	WorkerPod string
	// DevicePlugin is beta.kmm.node.kubernetes.io/version-schedule-pod.<ns>.<name> (upstream KMM's
	// name; before its rename, version-device-plugin: see SwitchedLabels).
	DevicePlugin string
}

// Observed is what the label step needs to know about the node besides its labels.
type Observed struct {
	// DevicePluginPodOnNode says whether a device plugin pod of the Module runs on the node.
	DevicePluginPodOnNode bool
	// LoadedVersion is the version the pair has loaded ("" when nothing is loaded).
	LoadedVersion string
	// Loaded says whether the pair is in state Loaded.
	Loaded bool
	// DRA says the Module runs a DRA driver (its pod counts in DevicePluginPodOnNode): the driver
	// leaves when the NMC controller takes the ready label away, once no ResourceClaim of its
	// devices is allocated on the node; the version label never takes it away first, and the
	// worker-pod label goes without waiting for it (the NMC controller orders driver and unload).
	DRA bool
}

// NextLabels returns the internal labels after one step of seed 002's flow (it never touches
// Target, which belongs to the user):
//
//  1. worker-pod label at the target and the target version loaded → device-plugin label to the
//     target (step 5), which lets the device plugin run again;
//  2. worker-pod label elsewhere → first remove the device-plugin label (step 2; for a DRA driver
//     only once its pod has left, which the NMC controller decides), wait for the device plugin pod
//     to leave, then remove the worker-pod label (step 3: the Module→NMC controller deletes
//     the spec entry and the module is unloaded), and once nothing is loaded set the worker-pod label
//     to the target (step 4: the entry comes back and the new version loads).
func NextLabels(l NodeLabels, o Observed) NodeLabels {
	next := l
	switch {
	case l.WorkerPod == l.Target:
		if o.Loaded && o.LoadedVersion == l.Target && l.DevicePlugin != l.Target {
			next.DevicePlugin = l.Target
		}
	case l.DevicePlugin != "" && (!o.DRA || !o.DevicePluginPodOnNode):
		next.DevicePlugin = ""
	case o.DevicePluginPodOnNode && !o.DRA:
		// wait for the device plugin pod to go (a DRA driver's goes after the spec entry: the
		// NMC controller keeps it while claims hold the node, and unloads only once it left)
	case l.WorkerPod != "":
		next.WorkerPod = ""
	case o.LoadedVersion == "":
		next.WorkerPod = l.Target
	}
	return next
}

// SwitchedLabels returns the node's version-schedule-pod label (current) and legacy
// version-device-plugin label (legacy) after one step of NextLabels on node labels l, for the switch
// from the legacy name (a node taken over from an older upstream KMM or kmm):
//
//  1. the new label is added first, with the legacy one's value, while the node has only the legacy
//     one: NextLabels reads the legacy value as the device-plugin label;
//  2. the device plugin DaemonSet's selector moves once every node has both (fsm.DevicePluginVersionKey);
//  3. the legacy label follows the new one while legacyNeeded (a DaemonSet or a pod on the node still
//     selects on it: removing it would take their pods off the node, or have the kubelet refuse a pod
//     it admits again), and is removed after.
func SwitchedLabels(l NodeLabels, legacy string, o Observed, legacyNeeded bool) (current, nextLegacy string) {
	if l.DevicePlugin == "" {
		l.DevicePlugin = legacy
	}
	current = NextLabels(l, o).DevicePlugin
	if legacyNeeded {
		return current, current
	}
	return current, ""
}
