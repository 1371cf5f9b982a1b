package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
)

// The node side of a takeover from upstream KMM (docs/migration.md): the facts an upstream record
// waits on (upstream's worker pods, whether kmm wrote the spec entry) and upstream's device plugin
// pods, which hold back an unload like kmm's own; fsm decides (fsm/adopt.go).

// upstreamDevicePluginsBeforeUnload reads, only when the decision is about to create an unload
// (or reload) pod, upstream KMM's device plugin pods on the node (uncached): a pod of the unloading pair's
// Module counts as its running device plugin, so the pair drains it first (invariant 6 across a
// takeover). It says whether the pairs must be decided again with that fact.
func (r *NMCReconciler) upstreamDevicePluginsBeforeUnload(ctx context.Context, f *nodeFacts, outcomes []pairOutcome) (bool, error) {
	if r.APIReader == nil || !slices.ContainsFunc(outcomes, plansUnload) {
		return false, nil
	}
	on, err := upstreamDevicePluginsOn(ctx, r.APIReader, r.Client, f.node.Name)
	if err != nil {
		return false, err
	}
	for _, o := range outcomes {
		if plansUnload(o) && on[o.key] && !f.dpRunning[o.key] {
			f.dpRunning[o.key], f.upstreamDevicePlugins = true, true
		}
	}
	return f.upstreamDevicePlugins, nil
}

// plansUnload says whether the pair is about to create a worker that unloads (an unload or a reload).
func plansUnload(o pairOutcome) bool {
	w := o.result.Plan.CreateWorker
	return w != nil && (w.Action == contract.ActionUnload || w.Action == contract.ActionReload)
}

// upstreamWorkers lists upstream KMM's worker pods on a node (uncached: kmm's cache holds only its
// own pods). It is called only for nodes with a record upstream left.
func upstreamWorkers(ctx context.Context, reader client.Reader, node string) ([]corev1.Pod, error) {
	req, err := labels.NewRequirement(shared.UpstreamWorkerActionLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	pods := &corev1.PodList{}
	// spec.nodeName is a field selector the API server answers for pods: one node's pods, not all.
	if err := reader.List(ctx, pods, client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*req)},
		client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName == node {
			out = append(out, p)
		}
	}
	return out, nil
}

// upstreamWorkerKey is the module key of an upstream worker pod.
func upstreamWorkerKey(p *corev1.Pod) string {
	name := p.Labels[shared.UpstreamModuleNameLabel]
	if name == "" {
		// Upstream names its worker pods kmm-worker-<node>-<module>.
		name = strings.TrimPrefix(p.Name, "kmm-worker-"+p.Spec.NodeName+"-")
	}
	return p.Namespace + "/" + name
}

// releaseUpstreamWorker removes the finalizers of a finished upstream worker pod and deletes it:
// upstream is not there to do it, and the pod's outcome is in upstream's record already (a pod
// that never reported leaves a record kmm does not adopt, so the module is loaded again).
func releaseUpstreamWorker(ctx context.Context, c client.Client, p *corev1.Pod) error {
	if len(p.Finalizers) > 0 {
		data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": nil, "resourceVersion": p.ResourceVersion}})
		if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, data)); err != nil {
			return shared.IgnoreGone(err)
		}
	}
	if p.DeletionTimestamp == nil {
		return shared.IgnoreGone(c.Delete(ctx, p, client.Preconditions{UID: &p.UID}))
	}
	return nil
}

// gatherUpstream fills in, for a node with a record upstream left (gather asks hasUpstreamRecord),
// which pairs still have a running upstream worker pod, and releases the finished ones (their
// outcome is in upstream's record, or missing from it, which kmm does not adopt).
func (r *NMCReconciler) gatherUpstream(ctx context.Context, f *nodeFacts) error {
	fresh := &kmmv1beta1.NodeModulesConfig{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Name: f.nmc.Name}, fresh); err != nil {
		return err
	}
	f.appliedByKMM = map[string]bool{}
	for _, e := range fresh.Spec.Modules {
		f.appliedByKMM[e.Namespace+"/"+e.Name] = shared.AppliedBy(fresh, shared.FieldManager(e.Namespace, e.Name))
	}
	pods, err := upstreamWorkers(ctx, r.APIReader, f.nmc.Name)
	if err != nil {
		return fmt.Errorf("listing upstream KMM's worker pods: %w", err)
	}
	f.upstreamWorkers = map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			f.upstreamWorkers[upstreamWorkerKey(p)] = true // still running: its pair waits
			continue
		}
		if err := releaseUpstreamWorker(ctx, r.Client, p); err != nil {
			return fmt.Errorf("releasing upstream KMM's worker pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// upstreamDevicePluginsOn lists, by module key, the pods of upstream's device plugins on a node
// (uncached), releasing the finalizer of those being deleted: they count as running until gone.
func upstreamDevicePluginsOn(ctx context.Context, reader client.Reader, c client.Client, node string) (map[string]bool, error) {
	sel, err := shared.UpstreamPodSelector("")
	if err != nil {
		return nil, err
	}
	list := &corev1.PodList{}
	if err := reader.List(ctx, list, client.MatchingLabelsSelector{Selector: sel}, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, fmt.Errorf("listing upstream KMM's device plugin pods on %s: %w", node, err)
	}
	out := map[string]bool{}
	var errs []error
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName != node || !shared.UpstreamDevicePluginPod(p) || podEnded(p) {
			continue
		}
		out[p.Namespace+"/"+p.Labels[shared.UpstreamModuleNameLabel]] = true
		if p.DeletionTimestamp != nil {
			errs = append(errs, shared.ReleaseUpstreamDevicePluginPod(ctx, c, p))
		}
	}
	return out, errors.Join(errs...)
}
