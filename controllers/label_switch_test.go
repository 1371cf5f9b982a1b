package controllers_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestLegacyVersionLabelSwitchKeepsDevicePluginPods: nodes and a device plugin DaemonSet as an older
// kmm (or upstream KMM before its rename) left them, the version on the legacy
// beta.kmm.node.kubernetes.io/version-device-plugin.<ns>.<name> label. kmm switches to upstream's
// version-schedule-pod label in order — the new label on every node first, then the DaemonSet's
// selector (OnDelete: its pods stay), the legacy label dropped only once nothing selects on it — and a
// pod watch started before kmm sees no device plugin pod deleted. Then a version bump upgrades each
// node the ordered way and the legacy label is gone everywhere. It fails when the DaemonSet's selector
// moves before the nodes carry the new label (fsm.DevicePluginVersionKey returning the new key: the
// DaemonSet controller deletes the pods), when the move rolls the pods (RollingUpdate), and when the
// label controller drops the legacy label while the DaemonSet still selects on it.
func TestLegacyVersionLabelSwitchKeepsDevicePluginPods(t *testing.T) {
	op := cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	target := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, target, "v1")
	}
	m := tb.VersionedModule("nic", "v1")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:v1"}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", tb.Nodes...)
	waitDevicePluginsReady(t, tb, "nic-device-plugin-v1", "")
	op.Stop()

	newKey := kmmv1beta1.DevicePluginVersionLabel(tb.NS, "nic")
	legacy, _ := kmmv1beta1.LegacyDevicePluginVersionLabel(tb.NS, "nic")
	leaveLegacyState(t, tb, m, newKey, legacy)

	deleted := watchDevicePluginDeletions(t, tb.NS)
	cluster.StartOperator(t)
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		if d := deleted.list(); len(d) > 0 {
			t.Fatalf("device plugin pods deleted during the switch: %v", d)
		}
		ds := &appsv1.DaemonSet{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "nic-device-plugin-v1"}, ds); err != nil {
			return false, err.Error()
		}
		sel := ds.Spec.Template.Spec.NodeSelector
		if sel[newKey] != "v1" || sel[legacy] != "" || ds.Status.ObservedGeneration < ds.Generation {
			return false, fmt.Sprintf("the DaemonSet's selector on the new label, seen by the DaemonSet controller: %v (observed generation %d of %d)",
				sel, ds.Status.ObservedGeneration, ds.Generation)
		}
		if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType || ds.Status.NumberAvailable != 3 {
			return false, fmt.Sprintf("strategy %s, %d available", ds.Spec.UpdateStrategy.Type, ds.Status.NumberAvailable)
		}
		for _, n := range tb.Nodes {
			if l := cluster.Node(t, n).Labels; l[newKey] != "v1" || l[legacy] != "v1" {
				return false, fmt.Sprintf("%s: new label %q, legacy %q; want both v1 while the pods select on the legacy one", n, l[newKey], l[legacy])
			}
		}
		return true, ""
	})
	if d := deleted.list(); len(d) > 0 {
		t.Fatalf("device plugin pods deleted during the switch: %v", d)
	}
	if deleted.seen() < 3 {
		t.Fatalf("the watch saw %d device plugin pods, want 3: it is not watching", deleted.seen())
	}

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, target, "v2")
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", tb.Nodes...)
	waitDevicePluginsReady(t, tb, "nic-device-plugin-v2", newKey)
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if l := cluster.Node(t, n).Labels; l[legacy] != "" || l[newKey] != "v2" {
				return false, fmt.Sprintf("%s: legacy label %q (want none), new label %q (want v2)", n, l[legacy], l[newKey])
			}
		}
		return true, ""
	})
}

// leaveLegacyState turns the bed into what an older kmm left: every node with the legacy label, the
// DaemonSet selecting on it with the template hash that kmm wrote then (its pods rolled onto that
// template and Ready), and then the new label removed from the nodes.
func leaveLegacyState(t *testing.T, tb *testbed.Bed, m *kmmv1beta1.Module, newKey, legacy string) {
	t.Helper()
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, legacy, "v1")
	}
	got := &kmmv1beta1.Module{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
		t.Fatal(err)
	}
	tmpl := module.DevicePluginTemplate(got)
	sel := maps.Clone(tmpl.Spec.NodeSelector)
	sel[legacy] = sel[newKey]
	delete(sel, newKey)
	tmpl.Spec.NodeSelector = sel
	hash, err := module.TemplateHash(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds := &appsv1.DaemonSet{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "nic-device-plugin-v1"}, ds); err != nil {
			return err
		}
		ds.Annotations["kmm.sigs.x-k8s.io/template-hash"] = hash
		ds.Spec.Template = tmpl
		return k8s.Update(context.Background(), ds)
	})
	if err != nil {
		t.Fatal(err)
	}
	waitDevicePluginsReady(t, tb, "nic-device-plugin-v1", legacy)
	for _, n := range tb.Nodes {
		cluster.SetNodeLabel(t, n, newKey, "")
	}
}

// waitDevicePluginsReady waits until DaemonSet name has rolled out (every pod on its current
// template, one Ready pod on each node of the bed) and, with selects, that each pod's node selector
// names that label.
func waitDevicePluginsReady(t *testing.T, tb *testbed.Bed, name, selects string) {
	t.Helper()
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		ds := &appsv1.DaemonSet{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: name}, ds); err != nil {
			return false, err.Error()
		}
		st := ds.Status
		if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != 3 || st.NumberAvailable != 3 || st.CurrentNumberScheduled != 3 {
			return false, fmt.Sprintf("DaemonSet %s rolled out: %+v", name, st)
		}
		pods := &corev1.PodList{}
		if err := k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.MatchingLabels{"kmm.sigs.x-k8s.io/daemonset": name}); err != nil {
			return false, err.Error()
		}
		var ready []string
		for _, p := range pods.Items {
			if _, ok := p.Spec.NodeSelector[selects]; p.DeletionTimestamp == nil && podIsReady(&p) && (selects == "" || ok) {
				ready = append(ready, p.Spec.NodeName)
			}
		}
		slices.Sort(ready)
		return slices.Equal(ready, tb.Nodes), fmt.Sprintf("one Ready pod of %s selecting on %q per node, have %v", name, selects, ready)
	})
}

// dpDeletions records every kmm device plugin pod of a namespace that is deleted (or marked so).
type dpDeletions struct {
	mu      sync.Mutex
	deleted []string
	pods    map[string]bool // name → deleted
}

func watchDevicePluginDeletions(t *testing.T, ns string) *dpDeletions {
	d := &dpDeletions{pods: map[string]bool{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, func(ev watch.EventType, p *corev1.Pod) {
		if p.Labels[contract.LabelDevicePlugin] != "true" {
			return
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		gone := ev == watch.Deleted || p.DeletionTimestamp != nil
		if gone && !d.pods[p.Name] {
			d.deleted = append(d.deleted, fmt.Sprintf("%s on %s", p.Name, p.Spec.NodeName))
		}
		d.pods[p.Name] = d.pods[p.Name] || gone
	}, client.InNamespace(ns))
	return d
}

func (d *dpDeletions) list() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.deleted)
}

func (d *dpDeletions) seen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pods)
}
