package fsm

import (
	"slices"
	"strings"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// The node labels kmm writes for its pairs (docs/api.md#labels): the ready label, the version.ready
// label, the device-plugin-ready and dra-ready labels (kmmv1beta1.StateLabels). Step decides the
// first two per pair (Plan.Ready, Plan.VersionReady: readyLabels); NodeLabels decides all for the node,
// with what only the node knows: which Modules exist, which device plugin pods are Ready, and which
// pairs are records upstream KMM left. The reconciler writes the difference to the node.

// readyLabels are the ready label and the version.ready value: a Loaded pair has them. A reload
// replaces the module within one worker run: with no device plugin to keep off the node meanwhile,
// the ready label stays through it (docs/api.md).
func readyLabels(f *Facts) (bool, string) {
	if f.state() == Loaded {
		return true, f.loadedVersion()
	}
	if f.claimsKeepDriver() {
		// The driver stays while claims it prepared are allocated: before an unload, while a load
		// runs or backs off with the module still in the kernel (claimsKeepDriver).
		return true, ""
	}
	return f.state() == Loading && f.reloadable() && !f.DevicePluginConfigured, ""
}

// LabelFacts is what the node-label decision reads of one node.
type LabelFacts struct {
	// Labels are the node's labels as read.
	Labels map[string]string
	// Modules are the keys ("<namespace>/<name>") of every Module that exists, being deleted or not.
	Modules map[string]bool
	// Pairs are the node's pairs with this reconcile's decisions, in a fixed order.
	Pairs []LabelPair
}

// LabelPair is one pair's part of LabelFacts.
type LabelPair struct {
	// Key is the Module's "<namespace>/<name>".
	Key string
	// Result is the pair's Step result.
	Result *Result
	// DevicePluginRunning says a device plugin pod of the Module is on the node (Facts.DevicePluginRunning).
	DevicePluginRunning bool
	// DevicePluginReady says one of kmm's device plugin pods of the Module on the node is Ready.
	DevicePluginReady bool
	// DRAReady says one of kmm's DRA driver pods of the Module on the node is Ready.
	DRAReady bool
}

// NodeLabelSet is the node-label decision: the labels the node should carry (Set) and those of
// kmm's it carries but should not (Remove, sorted). A label in neither is not kmm's to touch.
type NodeLabelSet struct {
	Set    map[string]string
	Remove []string
}

// NodeLabels decides kmm's labels of a node. A label is kmm's only when it is exactly a key of
// kmmv1beta1.StateLabels for a known Module (one that exists, or has a pair on the node): dots are
// legal in Module names, so a suffix such as ".ready" says nothing
// (kmm.node.kubernetes.io/upgrade-skip.ns.gpu.ready is the user's label of a Module named gpu.ready,
// not the ready label of a Module "ns.gpu" in namespace "upgrade-skip"). Each pair then sets what its
// plan says, in order, but for a record upstream KMM left that is not decided on yet, whose labels
// stay as upstream set them.
func NodeLabels(f LabelFacts) NodeLabelSet {
	want := map[string]*string{} // nil: kmm's label, to be removed
	own := func(key string) {
		ns, name, _ := strings.Cut(key, "/")
		for _, l := range kmmv1beta1.StateLabels(ns, name) {
			if _, ok := f.Labels[l]; ok {
				want[l] = nil
			}
		}
	}
	for key := range f.Modules {
		own(key)
	}
	for _, p := range f.Pairs {
		own(p.Key)
	}
	for _, p := range f.Pairs {
		ns, name, _ := strings.Cut(p.Key, "/")
		if undecidedUpstream(p.Result) {
			for _, l := range kmmv1beta1.StateLabels(ns, name) {
				delete(want, l)
			}
			continue
		}
		set := func(label, value string) { want[label] = &value }
		if p.Result.Plan.Ready {
			set(kmmv1beta1.ReadyLabel(ns, name), "")
		}
		if v := p.Result.Plan.VersionReady; v != "" {
			set(kmmv1beta1.VersionReadyLabel(ns, name), v)
		}
		if devicePluginReadyLabelled(f.Labels, p) {
			set(kmmv1beta1.DevicePluginReadyLabel(ns, name), "")
		}
		if p.Result.Plan.Ready && p.DRAReady {
			set(kmmv1beta1.DRAReadyLabel(ns, name), "")
		}
	}
	out := NodeLabelSet{Set: map[string]string{}}
	for l, v := range want {
		if v == nil {
			out.Remove = append(out.Remove, l)
		} else {
			out.Set[l] = *v
		}
	}
	slices.Sort(out.Remove)
	return out
}

// undecidedUpstream says whether the pair is a record upstream KMM left that Step has not decided on
// yet (it stays without a state): its labels stay as upstream set them.
func undecidedUpstream(r *Result) bool {
	return r.Status != nil && r.Status.State == ""
}

// devicePluginReadyLabelled says whether the node carries the pair's device-plugin-ready label: the
// module is loaded and a device plugin pod is Ready there, or the pair was adopted from upstream
// KMM, whose device plugin pods (not kmm's) still serve the node until kmm's own has a pod there:
// the label upstream set is then kept, never removed only to be set again.
func devicePluginReadyLabelled(nodeLabels map[string]string, p LabelPair) bool {
	if !p.Result.Plan.Ready {
		return false
	}
	if p.DevicePluginReady {
		return true
	}
	ns, name, _ := strings.Cut(p.Key, "/")
	_, has := nodeLabels[kmmv1beta1.DevicePluginReadyLabel(ns, name)]
	st := p.Result.Status
	return has && st != nil && st.Reason == string(Adopted) && !p.DevicePluginRunning
}
