package module

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
)

// The handover of upstream KMM's device plugin DaemonSets (fsm/handover.go decides): upstream
// creates one per Module (and version), named <module>-device-plugin-<random>, labelled with its
// module name label, controlled by the Module, its pods holding upstream's node-labeler finalizer.

// HandoverPoll is how often a Module whose upstream device plugin DaemonSets still exist is looked at
// again: upstream's pods are not in kmm's cache, so their changes do not wake it.
const HandoverPoll = 2 * time.Second

// HandoverStuckPoll is how often a Module whose device plugin handover is stuck is looked at again:
// what ends it, kmm's pods becoming Ready, changes kmm's DaemonSet, which wakes the Module anyway.
const HandoverStuckPoll = 30 * time.Second

// upstreamDevicePluginSets lists upstream KMM's device plugin DaemonSets of m: its DaemonSets but
// the DRA driver's (dra.go takes that one over).
func (r *Reconciler) upstreamDevicePluginSets(ctx context.Context, m *kmmv1beta1.Module) ([]appsv1.DaemonSet, error) {
	sets, err := r.upstreamDaemonSets(ctx, m)
	return slices.DeleteFunc(sets, func(ds appsv1.DaemonSet) bool {
		return ds.Labels[shared.UpstreamRoleLabel] == shared.UpstreamDRARole
	}), err
}

// upstreamDaemonSets lists upstream KMM's DaemonSets of m (from the cache: the Module controller
// owns DaemonSets): upstream's module name label, controlled by m, not kmm's.
func (r *Reconciler) upstreamDaemonSets(ctx context.Context, m *kmmv1beta1.Module) ([]appsv1.DaemonSet, error) {
	list := &appsv1.DaemonSetList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace), client.MatchingLabels{shared.UpstreamModuleNameLabel: m.Name}); err != nil {
		return nil, err
	}
	var out []appsv1.DaemonSet
	for _, ds := range list.Items {
		if ds.Labels[contract.LabelManagedBy] != contract.ManagedBy && metav1.IsControlledBy(&ds, m) {
			out = append(out, ds)
		}
	}
	return out, nil
}

// handOverDevicePlugin hands the Module's device plugin over from upstream KMM's DaemonSets to
// kmm's: it gathers where each runs, decides (fsm.DecideHandover), deletes upstream's DaemonSets in
// the foreground when the decision says so (the DaemonSet stays, being deleted, until its pods are
// gone, so a restarted kmm still finds it) and releases the finalizer of upstream's pods being
// deleted. It says whether upstream's DaemonSets are still there (the Module is looked at again);
// the scope gets which nodes wait and why, and past the handover timeout that the handover is stuck.
func (r *Reconciler) handOverDevicePlugin(ctx context.Context, s *moduleScope) (bool, error) {
	m := s.module
	sets, err := r.upstreamDevicePluginSets(ctx, m)
	if err != nil || len(sets) == 0 {
		return false, err
	}
	pods, err := r.upstreamDevicePluginPods(ctx, m)
	if err != nil {
		return true, err
	}
	facts := fsm.HandoverFacts{KMMRuns: m.Spec.DevicePlugin != nil && m.DeletionTimestamp.IsZero(),
		Now: r.clock().Now(), Timeout: r.HandoverTimeout}
	for i := range sets {
		facts.Since = later(facts.Since, sets[i].CreationTimestamp.Time)
	}
	var errs []error
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil {
			errs = append(errs, shared.ReleaseUpstreamDevicePluginPod(ctx, r.Client, p))
		} else if p.Spec.NodeName != "" {
			facts.UpstreamNodes = append(facts.UpstreamNodes, p.Spec.NodeName)
		}
	}
	if facts.KMMRuns {
		if err := r.gatherKMMDevicePlugin(ctx, m, &facts); err != nil {
			return true, err
		}
	}
	d := fsm.DecideHandover(facts)
	s.handoverMessage = d.Message
	if d.Stuck {
		s.handoverStuck = d.Message
	}
	if !d.DeleteUpstream {
		return true, errors.Join(errs...)
	}
	for i := range sets {
		errs = append(errs, r.deleteUpstreamDevicePlugin(ctx, m, &sets[i]))
	}
	return true, errors.Join(errs...)
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// upstreamDevicePluginPods lists the pods of upstream's device plugin of m, uncached (kmm's cache
// holds only its own pods); it is called only while upstream's DaemonSets of m exist.
func (r *Reconciler) upstreamDevicePluginPods(ctx context.Context, m *kmmv1beta1.Module) ([]corev1.Pod, error) {
	sel, err := shared.UpstreamPodSelector(m.Name)
	if err != nil {
		return nil, err
	}
	list := &corev1.PodList{}
	if err := r.reader().List(ctx, list, client.InNamespace(m.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("listing upstream KMM's device plugin pods: %w", err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if shared.UpstreamDevicePluginPod(&p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// gatherKMMDevicePlugin fills in, from the cache, where kmm's device plugin of m has a pod and where
// it is Ready, and moves the handover's start to the creation of kmm's newest device plugin
// DaemonSet of m (its pods could not be Ready before).
func (r *Reconciler) gatherKMMDevicePlugin(ctx context.Context, m *kmmv1beta1.Module, facts *fsm.HandoverFacts) error {
	sets := &appsv1.DaemonSetList{}
	if err := r.Client.List(ctx, sets, client.InNamespace(m.Namespace), client.MatchingLabels(devicePluginLabels(m))); err != nil {
		return err
	}
	for i := range sets.Items {
		facts.Since = later(facts.Since, sets.Items[i].CreationTimestamp.Time)
	}
	list := &corev1.PodList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace), client.MatchingLabels(devicePluginLabels(m))); err != nil {
		return err
	}
	facts.KMMReady, facts.KMMPods = map[string]bool{}, map[string]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		facts.KMMPods[p.Spec.NodeName] = true
		if shared.PodReady(p) {
			facts.KMMReady[p.Spec.NodeName] = true
		}
	}
	return nil
}

// deleteUpstreamDevicePlugin deletes one of upstream's device plugin DaemonSets in the foreground
// (not already being deleted), with an Event on the Module.
func (r *Reconciler) deleteUpstreamDevicePlugin(ctx context.Context, m *kmmv1beta1.Module, ds *appsv1.DaemonSet) error {
	if ds.DeletionTimestamp != nil {
		return nil
	}
	err := r.Client.Delete(ctx, ds, client.PropagationPolicy(metav1.DeletePropagationForeground), client.Preconditions{UID: &ds.UID})
	if err = shared.IgnoreGone(err); err != nil {
		return fmt.Errorf("deleting upstream KMM's device plugin DaemonSet %s: %w", ds.Name, err)
	}
	why := "kmm's device plugin is Ready on every node it served"
	if m.Spec.DevicePlugin == nil || !m.DeletionTimestamp.IsZero() {
		why = "kmm runs no device plugin for the Module"
	}
	r.Recorder.Eventf(m, ds, corev1.EventTypeNormal, "UpstreamDevicePluginRemoved", "HandOver",
		"deleted upstream KMM's device plugin DaemonSet %s: %s", ds.Name, why)
	return nil
}
