package shared

import (
	"context"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// What upstream KMM left, as both sides recognise it (docs/migration.md, "Words").
const (
	// UpstreamWorkerActionLabel marks upstream KMM's worker pods (Load or Unload).
	UpstreamWorkerActionLabel = "kmm.node.kubernetes.io/worker-action"
	// UpstreamModuleNameLabel names the Module of an upstream worker pod, device plugin DaemonSet
	// or device plugin pod (in the object's namespace).
	UpstreamModuleNameLabel = "kmm.node.kubernetes.io/module.name"
	// UpstreamDevicePluginFinalizer is the finalizer upstream KMM puts on its device plugin pods;
	// with upstream stopped, kmm releases it once the pod is being deleted.
	UpstreamDevicePluginFinalizer = "kmm.node.kubernetes.io/node-labeler"
)

// FieldManager is the field manager of a Module's NMC entries.
func FieldManager(namespace, name string) string {
	return "kmm-module/" + namespace + "/" + name
}

// AppliedBy says whether manager applied (server-side) something of the NMC.
func AppliedBy(nmc *kmmv1beta1.NodeModulesConfig, manager string) bool {
	if nmc == nil {
		return false
	}
	for _, mf := range nmc.ManagedFields {
		if mf.Manager == manager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.Subresource == "" {
			return true
		}
	}
	return false
}

// UpstreamDevicePluginPod says whether p is a pod of upstream KMM's device plugin: a DaemonSet's
// pod with upstream's module name label, not a worker and not kmm's.
func UpstreamDevicePluginPod(p *corev1.Pod) bool {
	if p.Labels[contract.LabelManagedBy] == contract.ManagedBy || p.Labels[UpstreamWorkerActionLabel] != "" {
		return false
	}
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.Kind == "DaemonSet" && p.Labels[UpstreamModuleNameLabel] != ""
}

// UpstreamPodSelector selects pods that carry upstream's module name label (named: one Module's).
func UpstreamPodSelector(name string) (labels.Selector, error) {
	op, values := selection.Exists, []string(nil)
	if name != "" {
		op, values = selection.Equals, []string{name}
	}
	req, err := labels.NewRequirement(UpstreamModuleNameLabel, op, values)
	if err != nil {
		return nil, err
	}
	return labels.NewSelector().Add(*req), nil
}

// ReleaseUpstreamDevicePluginPod removes upstream's finalizer from one of its device plugin pods
// being deleted (upstream is not there to do it); the pod goes once its node confirms it stopped.
func ReleaseUpstreamDevicePluginPod(ctx context.Context, c client.Client, p *corev1.Pod) error {
	var keep []string
	for _, f := range p.Finalizers {
		if f != UpstreamDevicePluginFinalizer {
			keep = append(keep, f)
		}
	}
	if len(keep) == len(p.Finalizers) {
		return nil
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": keep, "resourceVersion": p.ResourceVersion}})
	if err != nil {
		return err
	}
	return IgnoreGone(c.Patch(ctx, p, client.RawPatch(types.MergePatchType, data)))
}
