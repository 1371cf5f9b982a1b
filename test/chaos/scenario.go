package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	modulectrl "github.com/kmm-project/kmm/controllers/module"
)

// The phases of a round.
const (
	PhaseLoad    = "load"
	PhaseUpgrade = "upgrade"
	PhaseDelete  = "delete"
)

// Phases are a round's phases in order.
var Phases = []string{PhaseLoad, PhaseUpgrade, PhaseDelete}

func moduleName(i int) string { return fmt.Sprintf("mod%d", i) }

func image(name, version string) string { return "reg.example.com/chaos/" + name + ":" + version }

// module is the i-th Module at version v1: every node, a device plugin, an automatic rollout one
// node at a time with a drain of the pods labelled as using it.
func module(i int) *kmmv1beta1.Module {
	name := moduleName(i)
	one := intstr.FromInt32(1)
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"kmm-chaos": "true"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Version:        "v1",
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmm_chaos_" + name},
				KernelMappings: []kmmv1beta1.KernelMapping{{Literal: Kernel, ContainerImage: image(name, "v1")}},
			}},
			DevicePlugin: &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: image(name+"-dp", "v1")}},
			UpgradePolicy: &kmmv1beta1.UpgradePolicy{Automatic: true, MaxUnavailable: &one, Drain: &kmmv1beta1.DrainSpec{
				PodSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{usesLabel: name}},
				TimeoutSeconds: 5, PDBForceDrainTimeoutSeconds: 10,
			}},
		},
	}
}

// retry runs f until it succeeds or ctx ends: the harness's own calls outlive API server restarts.
func (h *harness) retry(ctx context.Context, what string, f func(context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// phase runs one phase of a round and waits until it converged. The phase's actions are done
// whole even when ctx ends meanwhile (the end of the faults), so that the convergence after the
// last fault waits for a known end state.
func (h *harness) phase(waitCtx context.Context, phase string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(waitCtx), 2*time.Minute)
	defer cancel()
	if err := h.act(ctx, phase); err != nil {
		return err
	}
	return h.waitConverged(waitCtx, phase)
}

// act does a phase's actions: create the Modules, bump them, or delete them.
func (h *harness) act(ctx context.Context, phase string) error {
	switch phase {
	case PhaseLoad:
		if err := h.labelNodes(ctx, "v1"); err != nil {
			return err
		}
		for i := range h.o.Modules {
			err := h.retry(ctx, "creating a Module", func(ctx context.Context) error {
				err := h.k8s.Create(ctx, module(i))
				if apierrors.IsAlreadyExists(err) {
					return h.notTerminating(ctx, moduleName(i))
				}
				return err
			})
			if err != nil {
				return err
			}
		}
	case PhaseUpgrade:
		if err := h.startWorkloads(ctx); err != nil {
			return err
		}
		for i := range h.o.Modules {
			if err := h.bump(ctx, moduleName(i), "v2"); err != nil {
				return err
			}
		}
	case PhaseDelete:
		for i := range h.o.Modules {
			err := h.retry(ctx, "deleting a Module", func(ctx context.Context) error {
				return client.IgnoreNotFound(h.k8s.Delete(ctx, module(i)))
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// notTerminating says whether the Module that already exists is the one a retried create made; an
// error (so that the create is retried) while it is the last round's, which the operator has not
// released yet.
func (h *harness) notTerminating(ctx context.Context, name string) error {
	m := &kmmv1beta1.Module{}
	if err := h.k8s.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, m); err != nil {
		return err
	}
	if !m.DeletionTimestamp.IsZero() {
		h.sayf("load: %s from the last round is still being deleted: the create waits", name)
		return fmt.Errorf("module %s is still being deleted", name)
	}
	return nil
}

// labelNodes sets every Module's version label on every node to version (what a user does before
// the first load of a versioned Module).
func (h *harness) labelNodes(ctx context.Context, version string) error {
	for _, n := range h.nodes {
		err := h.retry(ctx, "labelling "+n, func(ctx context.Context) error {
			node := &corev1.Node{}
			if err := h.k8s.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
				return err
			}
			for i := range h.o.Modules {
				node.Labels[kmmv1beta1.ModuleVersionLabel(Namespace, moduleName(i))] = version
			}
			return h.k8s.Update(ctx, node)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// startWorkloads runs, on every node, one pod per Module that the Module's drain evicts.
func (h *harness) startWorkloads(ctx context.Context) error {
	for _, n := range h.nodes {
		for i := range h.o.Modules {
			m := moduleName(i)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "uses-" + m + "-" + n, Labels: map[string]string{usesLabel: m}},
				Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "app", Image: "reg.example.com/app:1"}},
					TerminationGracePeriodSeconds: new(int64)},
			}
			err := h.retry(ctx, "creating a workload pod", func(ctx context.Context) error {
				err := h.k8s.Create(ctx, pod.DeepCopy())
				if apierrors.IsAlreadyExists(err) {
					return nil
				}
				return err
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// bump moves a Module to version (its image tagged with it), which starts the automatic rollout.
func (h *harness) bump(ctx context.Context, name, version string) error {
	return h.retry(ctx, "bumping "+name, func(ctx context.Context) error {
		m := &kmmv1beta1.Module{}
		if err := h.k8s.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, m); err != nil {
			return err
		}
		m.Spec.ModuleLoader.Container.Version = version
		m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = image(name, version)
		return h.k8s.Update(ctx, m)
	})
}

// waitConverged waits until the phase's end state holds (no timeout but ctx's).
func (h *harness) waitConverged(ctx context.Context, phase string) error {
	last := time.Now()
	for {
		var pending []string
		err := h.retry(ctx, "reading the cluster", func(ctx context.Context) error {
			var err error
			pending, err = h.unconverged(ctx, phase)
			return err
		})
		if err != nil {
			return err
		}
		if len(pending) == 0 {
			return nil
		}
		if time.Since(last) > 10*time.Second {
			h.sayf("%s: %d things pending, e.g. %s", phase, len(pending), pending[0])
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not converge: %s", phase, strings.Join(pending, "; "))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// unconverged lists what still differs from the end state of phase: pairs not Loaded with the
// phase's image (or not Absent after the deletion), worker pods left, cordoned nodes, workload
// pods the drain has not removed, device plugins not running.
func (h *harness) unconverged(ctx context.Context, phase string) ([]string, error) {
	var out []string
	nmcs := &kmmv1beta1.NodeModulesConfigList{}
	if err := h.k8s.List(ctx, nmcs); err != nil {
		return nil, err
	}
	version := map[string]string{PhaseLoad: "v1", PhaseUpgrade: "v2"}[phase]
	byNode := map[string]*kmmv1beta1.NodeModulesConfig{}
	for i := range nmcs.Items {
		byNode[nmcs.Items[i].Name] = &nmcs.Items[i]
	}
	for _, n := range h.nodes {
		for i := range h.o.Modules {
			if p := pairPending(byNode[n], n, moduleName(i), version); p != "" {
				out = append(out, p)
			}
		}
	}
	left, err := h.podsLeft(ctx, phase, version)
	if err != nil {
		return nil, err
	}
	out = append(out, left...)
	if phase == PhaseDelete {
		left, err := h.modulesLeft(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, left...)
	}
	nodes := &corev1.NodeList{}
	if err := h.k8s.List(ctx, nodes); err != nil {
		return nil, err
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			out = append(out, "node "+n.Name+" cordoned")
		}
	}
	sort.Strings(out)
	return out, nil
}

// podsLeft lists the worker pods left, after an upgrade the workload pods its drain has not
// removed, and after a load or an upgrade the nodes where a Module's device plugin of the phase's
// version does not run yet (a Module with a device plugin is in place on a node only once it runs;
// the next phase, a deletion for one, must find it there).
func (h *harness) podsLeft(ctx context.Context, phase, version string) ([]string, error) {
	pods := &corev1.PodList{}
	if err := h.k8s.List(ctx, pods, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		switch {
		case p.Labels[contract.LabelWorker] == "true":
			out = append(out, "worker pod "+p.Name+" left")
		case p.Labels[usesLabel] != "" && phase == PhaseUpgrade:
			out = append(out, "workload pod "+p.Name+" not drained")
		}
	}
	if version == "" {
		return out, nil
	}
	return append(out, h.devicePluginsMissing(pods.Items, version)...), nil
}

// devicePluginsMissing lists the nodes where a Module's device plugin of version has no Running pod.
func (h *harness) devicePluginsMissing(pods []corev1.Pod, version string) []string {
	running := map[string]bool{} // node/DaemonSet of the device plugin pods running
	for i := range pods {
		p := &pods[i]
		if p.Labels[contract.LabelDevicePlugin] != "true" || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		if owner := metav1.GetControllerOf(p); owner != nil {
			running[p.Spec.NodeName+"/"+owner.Name] = true
		}
	}
	var out []string
	for i := range h.o.Modules {
		m := module(i)
		m.Spec.ModuleLoader.Container.Version = version
		ds := modulectrl.DevicePluginName(m)
		for _, n := range h.nodes {
			if !running[n+"/"+ds] {
				out = append(out, "device plugin "+ds+" not running on "+n)
			}
		}
	}
	return out
}

// modulesLeft lists the Modules not gone yet: a deletion has converged only once the operator
// released each Module (its finalizer goes after the last node's status entry), or the next
// round's create would find the old Module.
func (h *harness) modulesLeft(ctx context.Context) ([]string, error) {
	modules := &kmmv1beta1.ModuleList{}
	if err := h.k8s.List(ctx, modules, client.InNamespace(Namespace)); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(modules.Items))
	for _, m := range modules.Items {
		out = append(out, fmt.Sprintf("Module %s not released (finalizers %v)", m.Name, m.Finalizers))
	}
	return out, nil
}

// pairPending says how a pair differs from Loaded at version (or from gone, version ""); "" when
// it does not.
func pairPending(nmc *kmmv1beta1.NodeModulesConfig, node, name, version string) string {
	spec, st := pairEntries(nmc, name)
	pair := name + " on " + node
	if version == "" {
		if spec != nil || (st != nil && st.State != kmmv1beta1.StateAbsent) {
			return pair + " not unloaded"
		}
		return ""
	}
	want := image(name, version)
	switch {
	case spec == nil || spec.Config.ContainerImage != want:
		return pair + ": spec not at " + version
	case st == nil:
		return pair + ": no status, not Loaded at " + version
	case st.State != kmmv1beta1.StateLoaded || st.Config == nil || st.Config.ContainerImage != want:
		return pair + ": " + string(st.State) + ", not Loaded at " + version
	case st.Drain != nil:
		return pair + ": drain record left"
	}
	return ""
}

// pairEntries are the spec and status entries of Module name in nmc (nil when absent).
func pairEntries(nmc *kmmv1beta1.NodeModulesConfig, name string) (*kmmv1beta1.NodeModuleSpec, *kmmv1beta1.NodeModuleStatus) {
	var spec *kmmv1beta1.NodeModuleSpec
	var st *kmmv1beta1.NodeModuleStatus
	if nmc == nil {
		return nil, nil
	}
	for i := range nmc.Spec.Modules {
		if e := &nmc.Spec.Modules[i]; e.Namespace == Namespace && e.Name == name {
			spec = e
		}
	}
	for i := range nmc.Status.Modules {
		if e := &nmc.Status.Modules[i]; e.Namespace == Namespace && e.Name == name {
			st = e
		}
	}
	return spec, st
}
