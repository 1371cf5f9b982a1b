package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

const (
	demoNamespace = "kmm-demo"
	demoModule    = "kmm-demo"
)

// walkThrough is the scenario: each step changes the world, waits for the outcome, and prints the table.
func (d *demo) walkThrough(ctx context.Context) error {
	steps := []struct {
		name string
		run  func(context.Context) (string, error)
	}{
		{"load v1 on every node", d.stepLoad},
		{"reboot node-1: reload", d.stepReboot},
		{"kernel upgrade of node-2: reload with the other kernel's image", d.stepKernelUpgrade},
		{"ordered upgrade v1 -> v2, node by node", d.stepOrderedUpgrade},
		{"delete the Module: unload everywhere", d.stepDelete},
	}
	for i, s := range steps {
		_, _ = fmt.Fprintf(d.o.Out, "\n==> Step %d: %s\n", i+1, s.name)
		start := time.Now()
		detail, err := s.run(ctx)
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, s.name, err)
		}
		d.summary.Steps = append(d.summary.Steps, Step{Name: s.name, Duration: time.Since(start), Detail: detail})
		if err := d.printStatus(ctx); err != nil {
			return err
		}
	}
	return d.printSummary(ctx)
}

func (d *demo) printStatus(ctx context.Context) error {
	out, err := d.kubectlKMM(ctx, "status")
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(d.o.Out, "$ kubectl kmm status\n%s", out)
	return nil
}

func (d *demo) printHistory(ctx context.Context, node string) error {
	out, err := d.kubectlKMM(ctx, "history", node)
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(d.o.Out, "$ kubectl kmm history %s\n%s", node, out)
	return nil
}

func (d *demo) printSummary(context.Context) error {
	_, _ = fmt.Fprintf(d.o.Out, "\n==> Summary\n")
	for _, s := range d.summary.Steps {
		_, _ = fmt.Fprintf(d.o.Out, "  ok  %-62s %6.1fs  %s\n", s.Name, s.Duration.Seconds(), s.Detail)
	}
	return nil
}

// module is the demo Module: two mappings (one per kernel), a device plugin, ordered upgrades.
func (d *demo) module() *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: demoModule},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"kmm-demo": "true"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Version:        "v1",
				ContainerImage: d.registry + "/kmm-demo/kmm-demo-v1:$KERNEL_FULL_VERSION",
				RegistryTLS:    kmmv1beta1.TLSOptions{Insecure: true},
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmm_demo"},
				KernelMappings: []kmmv1beta1.KernelMapping{{Literal: KernelA}, {VersionRange: ">=6.1.0-57 <6.2"}},
			}},
			DevicePlugin: &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "registry.example.com/kmm-demo-device-plugin:1.0"}},
		},
	}
}

func (d *demo) stepLoad(ctx context.Context) (string, error) {
	if err := d.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}); err != nil {
		return "", err
	}
	for _, n := range d.nodes {
		if err := d.setLabel(ctx, n, kmmv1beta1.ModuleVersionLabel(demoNamespace, demoModule), "v1"); err != nil {
			return "", err
		}
	}
	if err := d.k8s.Create(ctx, d.module()); err != nil {
		return "", err
	}
	if err := d.waitLoaded(ctx, "v1", d.nodes...); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d nodes Loaded with v1, device plugin running", len(d.nodes)), d.waitDevicePlugins(ctx, len(d.nodes))
}

func (d *demo) stepReboot(ctx context.Context) (string, error) {
	n := d.nodes[1%len(d.nodes)]
	before := d.agent.RunCount(n, demoNamespace+"/"+demoModule)
	if err := d.agent.Reboot(ctx, n); err != nil {
		return "", err
	}
	d.sayf("node %s rebooted: new boot ID %s", n, d.agent.BootID(n))
	err := d.waitFor(ctx, "the reload on "+n, func() (bool, string) {
		st := d.pair(n)
		return st != nil && st.State == kmmv1beta1.StateLoaded && st.BootID == d.agent.BootID(n), describe(st)
	})
	return fmt.Sprintf("reloaded on %s (worker runs %d -> %d)", n, before, d.agent.RunCount(n, demoNamespace+"/"+demoModule)), err
}

func (d *demo) stepKernelUpgrade(ctx context.Context) (string, error) {
	n := d.nodes[2%len(d.nodes)]
	if err := d.agent.SetKernel(ctx, n, KernelB); err != nil {
		return "", err
	}
	d.sayf("node %s now runs kernel %s", n, KernelB)
	err := d.waitFor(ctx, "the reload with the "+KernelB+" image on "+n, func() (bool, string) {
		st := d.pair(n)
		return st != nil && st.State == kmmv1beta1.StateLoaded && st.Config != nil && st.Config.ContainerImage == d.image("v1", KernelB), describe(st)
	})
	return "loaded " + d.image("v1", KernelB), err
}

func (d *demo) stepOrderedUpgrade(ctx context.Context) (string, error) {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &kmmv1beta1.Module{}
		if err := d.k8s.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: demoModule}, m); err != nil {
			return err
		}
		m.Spec.ModuleLoader.Container.Version = "v2"
		m.Spec.ModuleLoader.Container.ContainerImage = d.registry + "/kmm-demo/kmm-demo-v2:$KERNEL_FULL_VERSION"
		return d.k8s.Update(ctx, m)
	})
	if err != nil {
		return "", err
	}
	d.sayf("Module %s/%s now at version v2; moving the version-module label node by node", demoNamespace, demoModule)
	for _, n := range d.nodes {
		if err := d.setLabel(ctx, n, kmmv1beta1.ModuleVersionLabel(demoNamespace, demoModule), "v2"); err != nil {
			return "", err
		}
		if err := d.waitLoaded(ctx, "v2", n); err != nil {
			return "", err
		}
		d.sayf("%s: %s", n, d.transitions(n))
	}
	if err := d.printHistory(ctx, d.nodes[len(d.nodes)-1]); err != nil {
		return "", err
	}
	return fmt.Sprintf("v2 loaded on %d nodes, version.ready=v2", len(d.nodes)), d.waitDevicePlugins(ctx, len(d.nodes))
}

func (d *demo) stepDelete(ctx context.Context) (string, error) {
	if err := d.k8s.Delete(ctx, d.module()); err != nil {
		return "", err
	}
	err := d.waitFor(ctx, "the Module to be released after unloading", func() (bool, string) {
		err := d.k8s.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: demoModule}, &kmmv1beta1.Module{})
		return apierrors.IsNotFound(err), "the Module still exists"
	})
	if err != nil {
		return "", err
	}
	for _, n := range d.nodes {
		if st := d.pair(n); st != nil {
			return "", fmt.Errorf("%s still has %s", n, describe(st))
		}
		if _, loaded := d.agent.Loaded(n)[demoNamespace+"/"+demoModule]; loaded {
			return "", fmt.Errorf("the module is still loaded on %s", n)
		}
	}
	return "every pair Absent, Module released", nil
}

// waitLoaded waits until the pair is Loaded with version on every node given, and the node's
// kernel (as the agent simulates it) has it.
func (d *demo) waitLoaded(ctx context.Context, version string, nodes ...string) error {
	return d.waitFor(ctx, version+" Loaded on "+strings.Join(nodes, ", "), func() (bool, string) {
		for _, n := range nodes {
			st := d.pair(n)
			if st == nil || st.State != kmmv1beta1.StateLoaded || st.Config == nil || st.Config.Version != version {
				return false, n + ": " + describe(st)
			}
			if got, ok := d.agent.Loaded(n)[demoNamespace+"/"+demoModule]; !ok || got.Version != version {
				return false, n + ": the worker has not reported " + version + " loaded"
			}
		}
		return true, ""
	})
}

func (d *demo) waitDevicePlugins(ctx context.Context, want int) error {
	return d.waitFor(ctx, "device plugin pods on every node", func() (bool, string) {
		pods := &corev1.PodList{}
		_ = d.k8s.List(ctx, pods, client.InNamespace(demoNamespace), client.MatchingLabels{"kmm.sigs.x-k8s.io/device-plugin": "true"})
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		return running == want, fmt.Sprintf("%d of %d running", running, want)
	})
}

// pair is the demo Module's status entry on node n (nil when none).
func (d *demo) pair(n string) *kmmv1beta1.NodeModuleStatus {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := d.k8s.Get(context.Background(), client.ObjectKey{Name: n}, nmc); err != nil {
		return nil
	}
	return nmc.StatusEntry(demoNamespace, demoModule)
}

// transitions is the pair's recent path, e.g. "Loaded -> DevicePluginDraining -> ... -> Loaded".
func (d *demo) transitions(n string) string {
	st := d.pair(n)
	if st == nil {
		return "no status"
	}
	path := []string{}
	for _, t := range st.Transitions {
		if len(path) == 0 || t.To == kmmv1beta1.StateDevicePluginDraining {
			path = []string{string(t.From)}
		}
		path = append(path, string(t.To))
	}
	return strings.Join(path, " -> ")
}

func describe(st *kmmv1beta1.NodeModuleStatus) string {
	if st == nil {
		return "no status entry yet"
	}
	return fmt.Sprintf("%s (%s) %s", st.State, st.Reason, st.Message)
}

func (d *demo) setLabel(ctx context.Context, n, key, value string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := d.k8s.Get(ctx, client.ObjectKey{Name: n}, node); err != nil {
			return err
		}
		node.Labels[key] = value
		return d.k8s.Update(ctx, node)
	})
}
