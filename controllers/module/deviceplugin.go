package module

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

// devicePluginLabels mark every device plugin DaemonSet and pod of a Module.
func devicePluginLabels(m *kmmv1beta1.Module) map[string]string {
	return map[string]string{
		contract.LabelManagedBy:       contract.ManagedBy,
		contract.LabelDevicePlugin:    "true",
		contract.LabelModuleNamespace: m.Namespace,
		contract.LabelModuleName:      m.Name,
	}
}

// DevicePluginName is the name of a Module's device plugin DaemonSet (one per version when the
// Module has one, SPEC §7), at most 63 characters (a hash suffix shortens a longer one): its pods
// carry it as a label value.
func DevicePluginName(m *kmmv1beta1.Module) string {
	name := m.Name + "-device-plugin"
	if v := m.Spec.Version(); v != "" {
		name += "-" + v
	}
	return contract.Bounded(name, contract.MaxLabelValue)
}

// DevicePluginTemplate is the pod template of the Module's device plugin DaemonSet as kmm writes it
// (the node side's drain must spare its pods: its tests build them with it).
func DevicePluginTemplate(m *kmmv1beta1.Module) corev1.PodTemplateSpec {
	return devicePluginTemplate(DevicePluginName(m), m, devicePluginLabels(m), kmmv1beta1.DevicePluginVersionLabel(m.Namespace, m.Name))
}

// DevicePluginNodeSelector is where the device plugin (or DRA driver) runs: the selected nodes of a device-plugin-only
// Module, else nodes with the module loaded (and, with a version, the version-schedule-pod label of
// that version).
func DevicePluginNodeSelector(m *kmmv1beta1.Module) map[string]string {
	return devicePluginNodeSelector(m, kmmv1beta1.DevicePluginVersionLabel(m.Namespace, m.Name))
}

// devicePluginNodeSelector is DevicePluginNodeSelector with the version on versionKey (the legacy
// version-device-plugin label while nodes carry only that one: fsm.DevicePluginVersionKey).
func devicePluginNodeSelector(m *kmmv1beta1.Module, versionKey string) map[string]string {
	if m.Spec.DevicePluginOnly() {
		return maps.Clone(m.Spec.Selector)
	}
	sel := map[string]string{kmmv1beta1.ReadyLabel(m.Namespace, m.Name): ""}
	if v := m.Spec.Version(); v != "" {
		sel[versionKey] = v
	}
	return sel
}

// syncDevicePlugin creates or updates the wanted DaemonSet and deletes the Module's others.
func (r *Reconciler) syncDevicePlugin(ctx context.Context, s *moduleScope) error {
	m := s.module
	nodeLabels := make([]map[string]string, len(s.nodes))
	for j := range s.nodes {
		nodeLabels[j] = s.nodes[j].Labels
	}
	want := ""
	if m.Spec.DevicePlugin != nil && m.DeletionTimestamp.IsZero() {
		want = DevicePluginName(m)
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: want}}
		key := fsm.DevicePluginVersionKey(m, nodeLabels)
		if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, ds, func() error {
			return buildDevicePlugin(ds, m, r.Client.Scheme(), key)
		}); err != nil {
			return fmt.Errorf("device plugin DaemonSet %s: %w", want, err)
		}
	}
	list := &appsv1.DaemonSetList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace), client.MatchingLabels(devicePluginLabels(m))); err != nil {
		return err
	}
	var errs []error
	for i := range list.Items {
		ds := &list.Items[i]
		if ds.Name == want {
			continue
		}
		// An older version's DaemonSet stays while nodes are still labelled for it (ordered upgrade).
		if !fsm.KeepOldDevicePlugin(m, ds.Spec.Template.Spec.NodeSelector, nodeLabels) {
			errs = append(errs, client.IgnoreNotFound(r.Client.Delete(ctx, ds)))
		}
	}
	return errors.Join(errs...)
}

// buildDevicePlugin fills a DaemonSet from the Module's device plugin spec, its version selected on
// versionKey. The pod template is replaced only when its hash (kept in an annotation) changes, so
// that the API server's defaulting never causes a write on a resync. A template change rolls the pods
// (RollingUpdate), except the one that only moves the version from the legacy version-device-plugin
// label to upstream's version-schedule-pod label: that one is written with the OnDelete strategy, so
// the running pods, whose nodes carry both labels by then (fsm.DevicePluginVersionKey), stay.
func buildDevicePlugin(ds *appsv1.DaemonSet, m *kmmv1beta1.Module, scheme *runtime.Scheme, versionKey string) error {
	labels := devicePluginLabels(m)
	ds.Labels = labels
	if ds.Spec.Selector == nil {
		ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"kmm.sigs.x-k8s.io/daemonset": ds.Name}}
	}
	tmpl := devicePluginTemplate(ds.Name, m, labels, versionKey)
	old, changed, err := setTemplate(ds, tmpl)
	if err != nil {
		return err
	}
	if changed {
		ds.Spec.UpdateStrategy = updateStrategy(ds, m, labels, old)
	}
	return controllerutil.SetControllerReference(m, ds, scheme)
}

// setTemplate replaces the DaemonSet's pod template with tmpl when tmpl's hash differs from the
// one recorded in its annotation; it returns the hash it replaced and whether it did.
func setTemplate(ds *appsv1.DaemonSet, tmpl corev1.PodTemplateSpec) (old string, changed bool, err error) {
	hash, err := TemplateHash(tmpl)
	if err != nil {
		return "", false, err
	}
	old = ds.Annotations[annotationTemplateHash]
	if old == hash {
		return old, false, nil
	}
	metav1.SetMetaDataAnnotation(&ds.ObjectMeta, annotationTemplateHash, hash)
	ds.Spec.Template = tmpl
	return old, true, nil
}

// updateStrategy is the strategy of a DaemonSet whose template changes from the one hashed old: OnDelete
// when the change only moves the version selector off the legacy label, else RollingUpdate (the
// API server's default, kept for a new DaemonSet).
func updateStrategy(ds *appsv1.DaemonSet, m *kmmv1beta1.Module, labels map[string]string, old string) appsv1.DaemonSetUpdateStrategy {
	if legacy, ok := kmmv1beta1.LegacyDevicePluginVersionLabel(m.Namespace, m.Name); ok && old != "" && m.Spec.Version() != "" {
		if h, err := TemplateHash(devicePluginTemplate(ds.Name, m, labels, legacy)); err == nil && h == old {
			return appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
		}
	}
	if ds.Spec.UpdateStrategy.Type == appsv1.OnDeleteDaemonSetStrategyType {
		return appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType}
	}
	return ds.Spec.UpdateStrategy
}

// TemplateHash is the hash of a device plugin pod template that kmm records in the DaemonSet's
// kmm.sigs.x-k8s.io/template-hash annotation.
func TemplateHash(tmpl corev1.PodTemplateSpec) (string, error) {
	data, err := json.Marshal(tmpl)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:12]), nil
}

// annotationTemplateHash records the hash of the pod template kmm last wrote.
const annotationTemplateHash = "kmm.sigs.x-k8s.io/template-hash"

func devicePluginTemplate(dsName string, m *kmmv1beta1.Module, labels map[string]string, versionKey string) corev1.PodTemplateSpec {
	dp := m.Spec.DevicePlugin
	podLabels := map[string]string{"kmm.sigs.x-k8s.io/daemonset": dsName}
	for k, v := range labels {
		podLabels[k] = v
	}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
		Spec: corev1.PodSpec{
			NodeSelector: devicePluginNodeSelector(m, versionKey),
			// A device plugin is part of the node's function, as upstream KMM runs it: the kubelet
			// keeps it over ordinary workloads under resource pressure.
			PriorityClassName:            "system-node-critical",
			Tolerations:                  m.Spec.Tolerations,
			ServiceAccountName:           dp.ServiceAccountName,
			AutomountServiceAccountToken: dp.AutomountServiceAccountToken,
			Containers:                   []corev1.Container{devicePluginContainer("device-plugin", &dp.Container)},
			Volumes:                      slices.Concat(dp.Volumes, []corev1.Volume{{Name: "kubelet-device-plugins", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/device-plugins"}}}}),
		},
	}
	if dp.InitContainer != nil {
		tmpl.Spec.InitContainers = []corev1.Container{devicePluginContainer("device-plugin-init", dp.InitContainer)}
	}
	if m.Spec.ImageRepoSecret != nil {
		tmpl.Spec.ImagePullSecrets = []corev1.LocalObjectReference{*m.Spec.ImageRepoSecret}
	}
	return tmpl
}

func devicePluginContainer(name string, c *kmmv1beta1.DevicePluginContainerSpec) corev1.Container {
	pullPolicy := c.ImagePullPolicy
	if pullPolicy == "" {
		pullPolicy = corev1.PullIfNotPresent
	}
	return corev1.Container{
		Name:                     name,
		Image:                    c.Image,
		Command:                  c.Command,
		Args:                     c.Args,
		Env:                      c.Env,
		ImagePullPolicy:          pullPolicy,
		Resources:                c.Resources,
		StartupProbe:             c.StartupProbe,
		LivenessProbe:            c.LivenessProbe,
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		SecurityContext:          &corev1.SecurityContext{Privileged: ptr.To(true)},
		VolumeMounts:             slices.Concat(c.VolumeMounts, []corev1.VolumeMount{{Name: "kubelet-device-plugins", MountPath: "/var/lib/kubelet/device-plugins"}}),
	}
}
