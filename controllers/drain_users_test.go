package controllers_test

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestDrainEvictsDeviceUsers (issue 40, item 6): with drain.deviceUsers, a pod that requests the
// device plugin's extended resource is evicted before the unload though the podSelector does not
// select it; a pod beside it that uses no device of the Module is left alone; v2 ends loaded.
func TestDrainEvictsDeviceUsers(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	ctx := context.Background()
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	m := tb.VersionedModule("nic", "v1")
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{
		PodSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-nic"}},
		DeviceUsers:    &kmmv1beta1.DrainDeviceUsers{ExtendedResources: []string{"example.com/nic"}},
		TimeoutSeconds: 2, PDBForceDrainTimeoutSeconds: 4,
	}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)

	nic := corev1.ResourceList{"example.com/nic": resource.MustParse("1")}
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "consumer", Labels: map[string]string{"app": "other"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/app:1", Resources: corev1.ResourceRequirements{Limits: nic}}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "bystander", Labels: map[string]string{"app": "other"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/app:1"}}}},
	} {
		p.Spec.NodeName = n
		tb.Create(p)
	}
	waitRunning(t, tb.NS, n, "consumer", "bystander")

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v2")
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	cluster.AssertPassedThrough(t, n, tb.NS, fsm.DevicePluginDraining, fsm.Unloading, fsm.Upgrading, fsm.Loading, fsm.Loaded)
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: "consumer"}, &corev1.Pod{})
		return apierrors.IsNotFound(err), "the pod using example.com/nic evicted"
	})
	kept := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: "bystander"}, kept); err != nil || kept.DeletionTimestamp != nil {
		t.Errorf("the pod using no device of the Module was touched: %v %v", err, kept.DeletionTimestamp)
	}
}

// TestDrainWaitsForJobs (issue 40, item 6): with drain.jobs, the pod of a Job is left running for
// waitSeconds after the drain started (the pair says WaitingForJobs), then evicted as the other
// pods are (JobWaitExpired: the pair's reason and a Warning Event), and the upgrade goes on.
func TestDrainWaitsForJobs(t *testing.T) {
	const wait = 4
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	ctx := context.Background()
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v1")
	m := tb.VersionedModule("nic", "v1")
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{
		PodSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-nic"}},
		Jobs:           &kmmv1beta1.DrainJobs{WaitSeconds: wait},
		TimeoutSeconds: 2, PDBForceDrainTimeoutSeconds: 4,
	}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)

	// A Job and its pod (the testbed runs no Job controller: the pod is made as it would make it).
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "batch"}, Spec: batchv1.JobSpec{
		Suspend: ptr.To(true),
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "uses-nic"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/batch:1"}}}},
	}}
	tb.Create(job)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "batch-1", Labels: map[string]string{"app": "uses-nic"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: n, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/batch:1"}}}}
	tb.Create(pod)
	waitRunning(t, tb.NS, n, "batch-1")

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, kmmv1beta1.ModuleVersionLabel(tb.NS, "nic"), "v2")
	var start time.Time
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		if st == nil || st.Drain == nil || st.Reason != string(fsm.WaitingForJobs) {
			return false, "the pair waiting for the Job's pod: " + testbed.Describe(st)
		}
		start = st.Drain.StartTime.Time
		p := &corev1.Pod{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("the Job's pod is evicted while the pair waits for it: %v %v", err, p.DeletionTimestamp)
		}
		return true, ""
	})
	// The pod stays until the wait is over: polled until it goes, it must not go earlier.
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		p := &corev1.Pod{}
		err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), p)
		gone := apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil
		if gone && time.Since(start) < wait*time.Second-time.Second {
			// (a second of slack for the clocks of the API server's timestamps and this test)
			t.Fatalf("the Job's pod went %s after the drain started, before jobs.waitSeconds (%ds)", time.Since(start), wait)
		}
		if gone {
			t.Logf("the Job's pod went %s after the drain started (jobs.waitSeconds %d)", time.Since(start).Round(100*time.Millisecond), wait)
		}
		return gone, "the Job's pod drained once the wait is over"
	})
	cluster.AssertEvents(t, tb.NS, string(fsm.JobWaitExpired))
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	cluster.AssertPassedThrough(t, n, tb.NS, fsm.DevicePluginDraining, fsm.Unloading, fsm.Upgrading, fsm.Loading, fsm.Loaded)
	hist := cluster.PairStatus(n, tb.NS, "nic").Transitions
	said := map[string]int{}
	for _, tr := range hist {
		said[tr.Trigger]++
	}
	if said[string(fsm.WaitingForJobs)] != 1 || said[string(fsm.JobWaitExpired)] != 1 {
		t.Errorf("the pair said WaitingForJobs %d and JobWaitExpired %d times, want once each: %v", said[string(fsm.WaitingForJobs)], said[string(fsm.JobWaitExpired)], hist)
	}
}

// waitRunning waits until the named pods on node n run.
func waitRunning(t *testing.T, ns, n string, names ...string) {
	t.Helper()
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, name := range names {
			p := &corev1.Pod{}
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, p); err != nil || p.Spec.NodeName != n || p.Status.Phase != corev1.PodRunning {
				return false, name + " running on " + n
			}
		}
		return true, ""
	})
}
