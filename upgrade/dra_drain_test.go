package upgrade_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestDRADrainEvictsClaimHolders (issue 40, item 6): with drain.deviceUsers.resourceClaims, the pod
// a ResourceClaim of the Module's DRA driver is reserved for on the node is evicted by the upgrade
// drain though the podSelector does not select it; the pair waits for the claim meanwhile
// (ClaimsAllocated), and once the claim is released (the resource claim controller's part, played
// here) v2 is loaded. A pod beside it with no claim is left alone.
func TestDRADrainEvictsClaimHolders(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	ctx := context.Background()
	label := kmmv1beta1.ModuleVersionLabel(tb.NS, "nic")
	cluster.SetNodeLabel(t, n, label, "v1")
	class := tb.NS + ".gpu.example.com"
	m := tb.VersionedModule("nic", "v1")
	m.Spec.DRA = &kmmv1beta1.DRASpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dra:v1"},
		DriverName: "gpu.example.com", DeviceClasses: []kmmv1beta1.DeviceClassSpec{{Name: class}}}
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Drain: &kmmv1beta1.DrainSpec{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "uses-gpu"}},
		DeviceUsers: &kmmv1beta1.DrainDeviceUsers{ResourceClaims: true}, TimeoutSeconds: 600, PDBForceDrainTimeoutSeconds: 900}}
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:v1", n)
	waitDRADriver(t, tb.NS, "nic-dra-v1", n)

	pods := map[string]*corev1.Pod{}
	for _, name := range []string{"claim-user", "bystander"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: name, Labels: map[string]string{"app": "other"}},
			Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "c", Image: "reg.example.com/app:1"}}}}
		tb.Create(p)
		pods[name] = p
	}
	claim := allocateClaim(t, tb.NS, n, class)
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "claim-user", UID: pods["claim-user"].UID}}
	if err := k8s.Status().Update(ctx, claim); err != nil {
		t.Fatalf("reserving the claim for the pod: %v", err)
	}

	cluster.BumpVersion(t, m, "v2", "reg.example.com/nic:v2")
	cluster.SetNodeLabel(t, n, label, "v2")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(pods["claim-user"]), &corev1.Pod{})
		return apierrors.IsNotFound(err), "the pod holding the claim evicted"
	})
	if st := cluster.PairStatus(n, tb.NS, "nic"); st == nil || st.State != fsm.DevicePluginDraining {
		t.Fatalf("the pair went on while the claim is allocated: %s", testbed.Describe(st))
	}
	claim.Status.ReservedFor = nil // the pod is gone: the resource claim controller drops it, then deallocates
	releaseClaim(t, claim)
	tb.WaitLoaded("nic", "reg.example.com/nic:v2", n)
	kept := &corev1.Pod{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pods["bystander"]), kept); err != nil || kept.DeletionTimestamp != nil {
		t.Errorf("the pod with no claim was touched: %v %v", err, kept.DeletionTimestamp)
	}
}
