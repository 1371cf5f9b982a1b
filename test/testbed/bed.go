package testbed

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/poll"
)

// Bed is one test's namespace, nodes and selector label.
type Bed struct {
	// T is the test the Bed belongs to; its helpers fail it.
	T *testing.T
	// NS is the test's namespace.
	NS string
	// Label is the node label (value "yes") the test's Modules select.
	Label string
	// Nodes are the test's nodes, in the order they were added.
	Nodes []string

	c *Cluster
}

// NewBed creates a namespace and n nodes running kernel, selected by a label unique to the test.
func (c *Cluster) NewBed(t *testing.T, n int, kernel string) *Bed {
	t.Helper()
	id := c.seq.Add(1)
	tb := &Bed{T: t, NS: fmt.Sprintf("bed-%d", id), Label: fmt.Sprintf("kmm-test-%d", id), c: c}
	if err := c.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tb.NS}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		tb.AddNode(fmt.Sprintf("t%d-n%d", id, i), kernel)
	}
	return tb
}

// AddNode adds a node of the test running kernel.
func (tb *Bed) AddNode(name, kernel string) {
	tb.T.Helper()
	if err := tb.c.Agent.AddNode(context.Background(), name, kernel, map[string]string{tb.Label: "yes"}); err != nil {
		tb.T.Fatal(err)
	}
	tb.Nodes = append(tb.Nodes, name)
}

// Module returns a Module selecting the test's nodes: KernelA and KernelB have mappings, others do not.
func (tb *Bed) Module(name string) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{tb.Label: "yes"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: name},
				KernelMappings: []kmmv1beta1.KernelMapping{
					{Literal: KernelA, ContainerImage: "reg.example.com/" + name + ":a"},
					{Regexp: `^6\.1\.0-57-`, ContainerImage: "reg.example.com/" + name + ":b-$KERNEL_XYZ"},
				},
			}},
		},
	}
}

// VersionedModule is Module(name) at version, its first mapping's image tagged with the version.
func (tb *Bed) VersionedModule(name, version string) *kmmv1beta1.Module {
	m := tb.Module(name)
	m.Spec.ModuleLoader.Container.Version = version
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/" + name + ":" + version
	return m
}

// Create creates obj and fails the test when the API server refuses it.
func (tb *Bed) Create(obj client.Object) {
	tb.T.Helper()
	if err := tb.c.Client.Create(context.Background(), obj); err != nil {
		tb.T.Fatal(err)
	}
}

// WaitLoaded waits until the module is Loaded with image on every node given, in its NMC status
// and in the node's simulated kernel.
func (tb *Bed) WaitLoaded(name, image string, nodes ...string) {
	tb.T.Helper()
	Eventually(tb.T, 30*time.Second, func() (bool, string) {
		for _, n := range nodes {
			st := tb.c.PairStatus(n, tb.NS, name)
			if st == nil || st.State != kmmv1beta1.StateLoaded || st.Config == nil || st.Config.ContainerImage != image {
				return false, fmt.Sprintf("%s on %s: %+v, want Loaded with %s", name, n, Describe(st), image)
			}
			if got, ok := tb.c.Agent.Loaded(n)[tb.NS+"/"+name]; !ok || got.ContainerImage != image {
				return false, fmt.Sprintf("the kernel of %s does not have %s loaded (%v)", n, image, got.ContainerImage)
			}
		}
		return true, ""
	})
}

// Eventually polls cond until it holds or the timeout passes; cond says what it is waiting for.
func Eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	poll.Until(t, timeout, 100*time.Millisecond, cond)
}

// PairStatus returns the NMC status entry of a module on a node (nil when none).
func (c *Cluster) PairStatus(nodeName, ns, name string) *kmmv1beta1.NodeModuleStatus {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := c.Client.Get(context.Background(), client.ObjectKey{Name: nodeName}, nmc); err != nil {
		return nil
	}
	for i := range nmc.Status.Modules {
		if st := &nmc.Status.Modules[i]; st.Namespace == ns && st.Name == name {
			return st
		}
	}
	return nil
}

// Describe says what a pair's status entry holds, for failure messages.
func Describe(st *kmmv1beta1.NodeModuleStatus) string {
	if st == nil {
		return "no status entry"
	}
	img := ""
	if st.Config != nil {
		img = st.Config.ContainerImage
	}
	return fmt.Sprintf("%s (%s: %s) image %q attempts %d", st.State, st.Reason, st.Message, img, st.Attempts)
}

// AssertPassedThrough checks that the transition log of the pair of Module "nic" on node n visits
// the states in order.
func (c *Cluster) AssertPassedThrough(t *testing.T, n, ns string, states ...kmmv1beta1.ModuleState) {
	t.Helper()
	st := c.PairStatus(n, ns, "nic")
	var visited []kmmv1beta1.ModuleState
	for _, tr := range st.Transitions {
		visited = append(visited, tr.To)
	}
	i := 0
	for _, v := range visited {
		if i < len(states) && v == states[i] {
			i++
		}
	}
	if i != len(states) {
		t.Fatalf("the pair on %s went through %v, want %v in order", n, visited, states)
	}
}

// AssertEvents waits until the namespace has an Event with each reason.
func (c *Cluster) AssertEvents(t *testing.T, ns string, reasons ...string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() (bool, string) {
		evs := &eventsv1.EventList{}
		_ = c.Client.List(context.Background(), evs, client.InNamespace(ns))
		seen := map[string]bool{}
		for _, e := range evs.Items {
			seen[e.Reason] = true
		}
		for _, r := range reasons {
			if !seen[r] {
				return false, "an Event with reason " + r
			}
		}
		return true, ""
	})
}

// Node reads a Node.
func (c *Cluster) Node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := c.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

// SetNodeLabel sets (or with value "" removes) a label of a Node.
func (c *Cluster) SetNodeLabel(t *testing.T, name, key, value string) {
	t.Helper()
	c.SetLabel(t, &corev1.Node{}, name, key, value)
}

// SetLabel sets (or with value "" removes) a label of the cluster-scoped object name of obj's kind.
func (c *Cluster) SetLabel(t *testing.T, obj client.Object, name, key, value string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Client.Get(context.Background(), client.ObjectKey{Name: name}, obj); err != nil {
			return err
		}
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		if value == "" {
			delete(labels, key)
		} else {
			labels[key] = value
		}
		obj.SetLabels(labels)
		return c.Client.Update(context.Background(), obj)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BumpVersion moves a Module to version with the first mapping's image, in one update (seed 002).
func (c *Cluster) BumpVersion(t *testing.T, m *kmmv1beta1.Module, version, image string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &kmmv1beta1.Module{}
		if err := c.Client.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			return err
		}
		got.Spec.ModuleLoader.Container.Version = version
		got.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = image
		return c.Client.Update(context.Background(), got)
	})
	if err != nil {
		t.Fatal(err)
	}
}
