package node

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

// Before a pair may unload, whether its Module's device plugin or DRA driver pods are on the node
// is read from the API server, not from the cache (SPEC invariant 6). The DaemonSet controller
// creates a device plugin pod the moment the ready label lands on a node; kmm's pod informer may
// deliver it later than the event that makes the pair unload (the Module deleted right after its
// load, a version label moved), and an unload decided on that cache runs under the pod.

// readPluginsLive replaces the cache's view of kmm's device plugin and DRA driver pods on the node
// (nodeFacts.dpRunning, dpReady, draReady, draPods) with a live read, once per reconcile, when a
// pair whose Module has (or had) one may unload (fsm.Facts.MayUnload). A failed read fails the
// reconcile: it is retried with back-off, never taken as "no pods".
func (r *NMCReconciler) readPluginsLive(ctx context.Context, f *nodeFacts, node fsm.Node, now time.Time) error {
	if r.APIReader == nil || f.pluginsReadLive || !r.anyPluginPairMayUnload(f, node, now) {
		return nil
	}
	pods, err := r.livePluginPods(ctx, f)
	if err != nil {
		return err
	}
	f.dpRunning, f.dpReady, f.draReady, f.draPods = map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string][]*corev1.Pod{}
	for i := range pods {
		collectPod(f, &pods[i], f.node.Name)
	}
	f.pluginsReadLive = true
	return nil
}

// anyPluginPairMayUnload says whether a pair on the node may unload while its Module has a device
// plugin or DRA driver, the cache shows one of its pods, or the Module is gone.
func (r *NMCReconciler) anyPluginPairMayUnload(f *nodeFacts, node fsm.Node, now time.Time) bool {
	for _, key := range pairKeys(f) {
		if !f.dpModules[key] && !f.dpRunning[key] && f.moduleKeys[key] {
			continue
		}
		if facts := r.pairFacts(f, key, node, now); facts.MayUnload() {
			return true
		}
	}
	return false
}

// livePluginPods lists kmm's device plugin pods on the node and, when a Module has a DRA driver,
// its DRA driver pods: uncached, narrowed by label and by the spec.nodeName field
// selector the API server answers for pods.
func (r *NMCReconciler) livePluginPods(ctx context.Context, f *nodeFacts) ([]corev1.Pod, error) {
	kinds := []string{contract.LabelDevicePlugin}
	if len(f.drivers) > 0 {
		kinds = append(kinds, contract.LabelDRA)
	}
	var out []corev1.Pod
	for _, label := range kinds {
		list := &corev1.PodList{}
		if err := r.APIReader.List(ctx, list, client.HasLabels{label}, client.MatchingFields{"spec.nodeName": f.node.Name}); err != nil {
			return nil, fmt.Errorf("reading kmm's %s pods on %s before an unload: %w", label, f.node.Name, err)
		}
		out = append(out, list.Items...)
	}
	return out, nil
}
