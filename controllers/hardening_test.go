package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestRefusedConfigIsTerminalNotAStorm: a worker that refuses its config (InvalidConfig) ends the
// pair in LoadBackOff with that reason and one Warning Event; nothing retries it until the Module
// changes (issue 13: 2,452 worker pods in 60 s on 5 nodes).
func TestRefusedConfigIsTerminalNotAStorm(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	m := tb.Module("nic")
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/nic:refusedconfig"
	tb.Create(m)

	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return st != nil && st.State == kmmv1beta1.StateLoadBackOff && st.Reason == fsm.ReasonInvalidConfig, testbed.Describe(st)
	})
	// Several back-offs of the test policy (1 s doubling to 4 s) pass: still one run.
	time.Sleep(4 * testbed.BackOff.Max)
	if runs := node.RunCount(n, tb.NS+"/nic"); runs != 1 {
		t.Fatalf("%d worker runs for a refused config, want 1: %s", runs, testbed.Describe(cluster.PairStatus(n, tb.NS, "nic")))
	}
	if st := cluster.PairStatus(n, tb.NS, "nic"); st.Attempts != 1 || st.State != kmmv1beta1.StateLoadBackOff {
		t.Fatalf("after the back-offs: %s", testbed.Describe(st))
	}
	if got := warningEvents(t, tb.NS, "nic", fsm.ReasonInvalidConfig); got != 1 {
		t.Errorf("%d Warning Events InvalidConfig on the Module, want 1", got)
	}

	setFirstImage(t, m, "reg.example.com/nic:fixed")
	tb.WaitLoaded("nic", "reg.example.com/nic:fixed", n)
}

// TestRefusedWorkerPodIsReportedAndBacksOff: a namespace whose Pod Security level forbids the
// worker pod (SYS_MODULE, hostPath) makes the API server refuse it; the pair reports PodRejected
// with a Warning Event and retries with back-off, and loads once the policy allows the pod.
func TestRefusedWorkerPodIsReportedAndBacksOff(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	setNamespaceLabel(t, tb.NS, "pod-security.kubernetes.io/enforce", "baseline")
	tb.Create(tb.Module("nic"))

	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return st != nil && st.Reason == fsm.ReasonPodRejected && strings.Contains(st.Message, "forbidden") && st.Attempts >= 2, testbed.Describe(st)
	})
	if got := warningEvents(t, tb.NS, "nic", fsm.ReasonPodRejected); got < 1 {
		t.Errorf("no Warning Event PodRejected on the Module")
	}
	// Back-off holds: within 6 s of the policy (1, 2, 4, 4 s ...) at most a handful of attempts.
	before := cluster.PairStatus(n, tb.NS, "nic").Attempts
	time.Sleep(6 * time.Second)
	if after := cluster.PairStatus(n, tb.NS, "nic").Attempts; after-before > 3 {
		t.Fatalf("attempts went from %d to %d in 6 s: back-off not held", before, after)
	}
	setNamespaceLabel(t, tb.NS, "pod-security.kubernetes.io/enforce", "privileged")
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)
}

// TestKernelStringsANodeCannotHaveAreNotLoaded: a node reporting a kernel version that is no kernel
// release (too long, a "/") gets no spec entry and no worker pod; the Module says why.
func TestKernelStringsANodeCannotHaveAreNotLoaded(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	tb.AddNode(tb.Nodes[0]+"-slash", "6.1.0-56/../../../etc")
	tb.AddNode(tb.Nodes[0]+"-long", strings.Repeat("6", 4096))
	m := tb.Module("nic")
	m.Spec.ModuleLoader.Container.KernelMappings = append(m.Spec.ModuleLoader.Container.KernelMappings, kmmv1beta1.KernelMapping{Regexp: "^.+$", ContainerImage: "reg.example.com/nic:any"})
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes[0])

	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		_ = k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "nic"}, got)
		c := meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionDegraded)
		return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, tb.Nodes[1]) && strings.Contains(c.Message, tb.Nodes[2]),
			fmt.Sprintf("Degraded condition %+v", c)
	})
	for _, bad := range tb.Nodes[1:] {
		if len(workerPodsOn(t, bad)) != 0 || node.RunCount(bad, tb.NS+"/nic") != 0 {
			t.Errorf("a worker pod ran on %s", bad)
		}
		if st := cluster.PairStatus(bad, tb.NS, "nic"); st != nil && st.State != kmmv1beta1.StateAbsent {
			t.Errorf("%s has %s", bad, testbed.Describe(st))
		}
	}
}

// warningEvents counts the Warning Events with reason on Module name.
func warningEvents(t *testing.T, ns, name, reason string) int {
	t.Helper()
	n := 0
	for _, e := range listEvents(t, ns) {
		if e.Regarding.Kind == "Module" && e.Regarding.Name == name && e.Reason == reason && e.Type == corev1.EventTypeWarning {
			n++
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	return n
}

func setFirstImage(t *testing.T, m *kmmv1beta1.Module, image string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			return err
		}
		got.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = image
		return k8s.Update(context.Background(), got)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func setNamespaceLabel(t *testing.T, ns, key, value string) {
	t.Helper()
	cluster.SetLabel(t, &corev1.Namespace{}, ns, key, value)
}

// TestRefusedDevicePluginIsReported: a DaemonSet the API server refuses (here two volumes of one
// name, which the Module's schema lets through) makes the Module Degraded with reason ObjectRefused
// and a Warning Event; the kmod is still loaded, and a fixed Module clears it.
func TestRefusedDevicePluginIsReported(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	m := tb.Module("nic")
	dev := corev1.Volume{Name: "dev", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev"}}}
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"},
		Volumes: []corev1.Volume{dev, dev}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes[0])
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		_ = k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got)
		c := meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionDegraded)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == kmmv1beta1.ReasonObjectRefused && strings.Contains(c.Message, "Duplicate value"),
			fmt.Sprintf("Degraded condition %+v", c)
	})
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		n := warningEvents(t, tb.NS, "nic", kmmv1beta1.ReasonObjectRefused)
		return n >= 1, fmt.Sprintf("%d Warning Events ObjectRefused", n)
	})
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			return err
		}
		got.Spec.DevicePlugin.Volumes = got.Spec.DevicePlugin.Volumes[:1]
		return k8s.Update(context.Background(), got)
	})
	if err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		_ = k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got)
		c := meta.FindStatusCondition(got.Status.Conditions, kmmv1beta1.ConditionDegraded)
		dss := &appsv1.DaemonSetList{}
		_ = k8s.List(context.Background(), dss, client.InNamespace(tb.NS))
		return c != nil && c.Status == metav1.ConditionFalse && len(dss.Items) == 1, fmt.Sprintf("Degraded condition %+v, %d DaemonSets after the fix", c, len(dss.Items))
	})
}

// listEvents lists the Events of a namespace.
func listEvents(t *testing.T, ns string) []eventsv1.Event {
	t.Helper()
	evs := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return evs.Items
}
