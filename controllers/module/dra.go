package module

import (
	"context"
	"errors"
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
)

// +kubebuilder:rbac:groups=resource.k8s.io,resources=deviceclasses,verbs=get;list;watch;create;update;patch;delete

// draLabels mark every DRA driver DaemonSet and pod of a Module, and its DeviceClasses.
func draLabels(m *kmmv1beta1.Module) map[string]string {
	return map[string]string{
		contract.LabelManagedBy:       contract.ManagedBy,
		contract.LabelDRA:             "true",
		contract.LabelModuleNamespace: m.Namespace,
		contract.LabelModuleName:      m.Name,
	}
}

// DRAName is the name of a Module's DRA driver DaemonSet (one per version during an ordered
// upgrade, as a device plugin's), at most 63 characters.
func DRAName(m *kmmv1beta1.Module) string {
	name := m.Name + "-dra"
	if v := m.Spec.Version(); v != "" {
		name += "-" + v
	}
	return contract.Bounded(name, contract.MaxLabelValue)
}

// DRATemplate is the pod template of the Module's DRA driver DaemonSet as kmm writes it.
func DRATemplate(m *kmmv1beta1.Module) corev1.PodTemplateSpec {
	return draTemplate(DRAName(m), m, draLabels(m))
}

// syncDRA keeps the Module's DRA driver DaemonSets and DeviceClasses: the wanted DaemonSet, an
// older version's while nodes are still labelled for it, none once the Module has no spec.dra, and
// every one it has while the Module is being deleted (none is created then); upstream KMM's DRA driver DaemonSet goes first (takeover.go's words: two drivers
// of one name on a node would both register with the kubelet).
func (r *Reconciler) syncDRA(ctx context.Context, s *moduleScope) error {
	m := s.module
	upstream, err := r.removeUpstreamDRA(ctx, m)
	if err != nil {
		return err
	}
	want := ""
	if m.Spec.DRA != nil && m.DeletionTimestamp.IsZero() && !upstream {
		want = DRAName(m)
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: want}}
		if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, ds, func() error {
			return buildDRA(ds, m, r.Client.Scheme())
		}); err != nil {
			return fmt.Errorf("DRA driver DaemonSet %s: %w", want, err)
		}
	}
	list := &appsv1.DaemonSetList{}
	if err := r.Client.List(ctx, list, client.InNamespace(m.Namespace), client.MatchingLabels(draLabels(m))); err != nil {
		return err
	}
	errs := []error{r.syncDeviceClasses(ctx, m)}
	nodeLabels := make([]map[string]string, len(s.nodes))
	for j := range s.nodes {
		nodeLabels[j] = s.nodes[j].Labels
	}
	for i := range list.Items {
		ds := &list.Items[i]
		if !m.DeletionTimestamp.IsZero() {
			// Kept while the Module is being deleted: its pod leaves a node when the NMC controller
			// takes the ready label away there, which waits for the ResourceClaims of the driver's
			// devices on the node (the kubelet needs the driver to unprepare them); the garbage
			// collector deletes the DaemonSet with the Module.
			continue
		}
		if ds.Name != want && !fsm.KeepOldDevicePlugin(m, ds.Spec.Template.Spec.NodeSelector, nodeLabels) {
			errs = append(errs, client.IgnoreNotFound(r.Client.Delete(ctx, ds)))
		}
	}
	return errors.Join(errs...)
}

// buildDRA fills a DaemonSet from the Module's spec.dra; the pod template is replaced only when its
// hash changes, as for a device plugin.
func buildDRA(ds *appsv1.DaemonSet, m *kmmv1beta1.Module, scheme *runtime.Scheme) error {
	labels := draLabels(m)
	ds.Labels = labels
	if ds.Spec.Selector == nil {
		ds.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"kmm.sigs.x-k8s.io/daemonset": ds.Name}}
	}
	if _, _, err := setTemplate(ds, draTemplate(ds.Name, m, labels)); err != nil {
		return err
	}
	return controllerutil.SetControllerReference(m, ds, scheme)
}

// The host directories a DRA kubelet plugin works in: its socket and the kubelet's plugin
// registration directory, and the CDI specs it writes for the container runtime.
const (
	kubeletPluginsDir  = "/var/lib/kubelet/plugins"
	kubeletRegistryDir = "/var/lib/kubelet/plugins_registry"
	cdiDir             = "/var/run/cdi"
)

func draTemplate(dsName string, m *kmmv1beta1.Module, labels map[string]string) corev1.PodTemplateSpec {
	d := m.Spec.DRA
	podLabels := map[string]string{"kmm.sigs.x-k8s.io/daemonset": dsName}
	for k, v := range labels {
		podLabels[k] = v
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	hostDirs := []struct{ name, path string }{{"kubelet-plugins", kubeletPluginsDir}, {"kubelet-plugins-registry", kubeletRegistryDir}, {"cdi", cdiDir}}
	var vols []corev1.Volume
	var mounts []corev1.VolumeMount
	for _, h := range hostDirs {
		vols = append(vols, corev1.Volume{Name: h.name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: h.path, Type: &dirOrCreate}}})
		mounts = append(mounts, corev1.VolumeMount{Name: h.name, MountPath: h.path})
	}
	c := devicePluginContainer("dra", &d.Container)
	c.VolumeMounts = slices.Concat(d.Container.VolumeMounts, mounts)
	c.Env = slices.Concat([]corev1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "DRA_DRIVER_NAME", Value: d.DriverName},
		{Name: "CDI_ROOT", Value: cdiDir},
	}, d.Container.Env)
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
		Spec: corev1.PodSpec{
			NodeSelector:                 DevicePluginNodeSelector(m),
			PriorityClassName:            "system-node-critical",
			Tolerations:                  m.Spec.Tolerations,
			ServiceAccountName:           d.ServiceAccountName,
			AutomountServiceAccountToken: d.AutomountServiceAccountToken,
			Containers:                   []corev1.Container{c},
			Volumes:                      slices.Concat(d.Volumes, vols),
		},
	}
	if d.InitContainer != nil {
		ic := devicePluginContainer("dra-init", d.InitContainer)
		ic.VolumeMounts = d.InitContainer.VolumeMounts
		tmpl.Spec.InitContainers = []corev1.Container{ic}
	}
	if m.Spec.ImageRepoSecret != nil {
		tmpl.Spec.ImagePullSecrets = []corev1.LocalObjectReference{*m.Spec.ImageRepoSecret}
	}
	return tmpl
}

// syncDeviceClasses makes the Module's DeviceClasses what spec.dra.deviceClasses says and deletes
// the Module's others (all of them once it is being deleted or has no spec.dra). A DeviceClass is
// the Module's when it carries kmm's labels of the Module, or upstream KMM's (adopted: relabelled);
// one of the wanted name that is not the Module's is left alone, and the reconcile fails with a
// refusal naming it. DeviceClasses are cluster-scoped: no owner reference can point at a Module,
// so the labels are the ownership.
func (r *Reconciler) syncDeviceClasses(ctx context.Context, m *kmmv1beta1.Module) error {
	var want []kmmv1beta1.DeviceClassSpec
	if m.Spec.DRA != nil && m.DeletionTimestamp.IsZero() {
		want = m.Spec.DRA.DeviceClasses
	}
	mine, err := r.moduleDeviceClasses(ctx, m)
	if err != nil {
		return err
	}
	var errs []error
	for _, spec := range want {
		errs = append(errs, r.applyDeviceClass(ctx, m, spec))
		delete(mine, spec.Name)
	}
	for _, dc := range mine {
		errs = append(errs, shared.IgnoreGone(r.Client.Delete(ctx, dc, client.Preconditions{UID: &dc.UID})))
	}
	return errors.Join(errs...)
}

// moduleDeviceClasses are the DeviceClasses carrying kmm's or upstream KMM's labels of m, by name.
func (r *Reconciler) moduleDeviceClasses(ctx context.Context, m *kmmv1beta1.Module) (map[string]*resourcev1.DeviceClass, error) {
	out := map[string]*resourcev1.DeviceClass{}
	for _, sel := range []client.MatchingLabels{
		{contract.LabelManagedBy: contract.ManagedBy, contract.LabelModuleNamespace: m.Namespace, contract.LabelModuleName: m.Name},
		{shared.UpstreamModuleNameLabel: m.Name, shared.UpstreamModuleNamespaceLabel: m.Namespace},
	} {
		list := &resourcev1.DeviceClassList{}
		if err := r.Client.List(ctx, list, sel); err != nil {
			return nil, fmt.Errorf("listing the DeviceClasses of %s/%s: %w", m.Namespace, m.Name, err)
		}
		for i := range list.Items {
			out[list.Items[i].Name] = &list.Items[i]
		}
	}
	return out, nil
}

// ErrDeviceClassTaken says a DeviceClass of the name spec.dra.deviceClasses asks for exists and is not
// the Module's.
var ErrDeviceClassTaken = errors.New("exists and is not this Module's")

// applyDeviceClass creates or updates one DeviceClass of m.
func (r *Reconciler) applyDeviceClass(ctx context.Context, m *kmmv1beta1.Module, spec kmmv1beta1.DeviceClassSpec) error {
	dc := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: spec.Name}}
	_, err := controllerutil.CreateOrUpdate(ctx, r.Client, dc, func() error {
		if !dc.CreationTimestamp.IsZero() && !deviceClassOf(dc.Labels, m) {
			return fmt.Errorf("DeviceClass %s %w", spec.Name, ErrDeviceClassTaken)
		}
		if dc.Labels == nil {
			dc.Labels = map[string]string{}
		}
		delete(dc.Labels, shared.UpstreamModuleNameLabel)
		delete(dc.Labels, shared.UpstreamModuleNamespaceLabel)
		dc.Labels[contract.LabelManagedBy] = contract.ManagedBy
		dc.Labels[contract.LabelModuleNamespace] = m.Namespace
		dc.Labels[contract.LabelModuleName] = m.Name
		dc.Spec.Selectors = spec.Selectors
		dc.Spec.Config = spec.Config
		return nil
	})
	if errors.Is(err, ErrDeviceClassTaken) {
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, "DeviceClassTaken", "ApplyDeviceClass", "%v: rename it in spec.dra.deviceClasses or delete it", err)
	}
	return err
}

// deviceClassOf says whether DeviceClass labels name Module m (kmm's labels or upstream KMM's).
func deviceClassOf(labels map[string]string, m *kmmv1beta1.Module) bool {
	kmm := labels[contract.LabelManagedBy] == contract.ManagedBy && labels[contract.LabelModuleNamespace] == m.Namespace && labels[contract.LabelModuleName] == m.Name
	upstream := labels[shared.UpstreamModuleNameLabel] == m.Name && labels[shared.UpstreamModuleNamespaceLabel] == m.Namespace
	return kmm || upstream
}

// removeUpstreamDRA deletes upstream KMM's DRA driver DaemonSets of m in the foreground and releases
// the finalizer of their pods being deleted; it says whether one is still there (kmm's own waits).
func (r *Reconciler) removeUpstreamDRA(ctx context.Context, m *kmmv1beta1.Module) (bool, error) {
	sets, err := r.upstreamDaemonSets(ctx, m)
	if err != nil {
		return false, err
	}
	var errs []error
	found := false
	for i := range sets {
		ds := &sets[i]
		if ds.Labels[shared.UpstreamRoleLabel] != shared.UpstreamDRARole {
			continue
		}
		found = true
		if ds.DeletionTimestamp == nil {
			err := r.Client.Delete(ctx, ds, client.PropagationPolicy(metav1.DeletePropagationForeground), client.Preconditions{UID: &ds.UID})
			errs = append(errs, shared.IgnoreGone(err))
			r.Recorder.Eventf(m, ds, corev1.EventTypeNormal, "UpstreamDRARemoved", "TakeOver",
				"deleting upstream KMM's DRA driver DaemonSet %s: kmm's starts once its pods are gone", ds.Name)
		}
	}
	if found {
		pods, err := r.upstreamDevicePluginPods(ctx, m)
		errs = append(errs, err)
		for i := range pods {
			if pods[i].DeletionTimestamp != nil {
				errs = append(errs, shared.ReleaseUpstreamDevicePluginPod(ctx, r.Client, &pods[i]))
			}
		}
	}
	return found, errors.Join(errs...)
}
