package agent_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/test/agent"
)

// TestRealNodesRenewLeasesAndPostStatus: with RealNodes and the heartbeat periods, a node's status
// looks like a real kubelet's (images, every condition, internal address, system info), its Lease
// in kube-node-lease is renewed again and again, and its status is posted again with a later
// heartbeat time; what the agent decides (kernel, boot ID, Ready) stays.
func TestRealNodesRenewLeasesAndPostStatus(t *testing.T) {
	own, _, node := startOwnAgent(t, agent.Options{RealNodes: true, LeasePeriod: 300 * time.Millisecond, StatusPeriod: 1200 * time.Millisecond})
	n := getNode(t, node)
	if len(n.Status.Images) != 50 || len(n.Status.Conditions) != 4 || n.Status.NodeInfo.MachineID == "" ||
		n.Status.Addresses[0].Type != corev1.NodeInternalIP {
		t.Errorf("the node does not look real: %d images, conditions %v, machine ID %q, addresses %v",
			len(n.Status.Images), n.Status.Conditions, n.Status.NodeInfo.MachineID, n.Status.Addresses)
	}
	firstBeat := readyCondition(t, n).LastHeartbeatTime
	var renewals []time.Time
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		var lease coordinationv1.Lease
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node}, &lease); err != nil || lease.Spec.RenewTime == nil {
			return false, nil
		}
		if r := lease.Spec.RenewTime.Time; len(renewals) == 0 || r.After(renewals[len(renewals)-1]) {
			renewals = append(renewals, r)
		}
		return len(renewals) >= 3 && readyCondition(t, getNode(t, node)).LastHeartbeatTime.After(firstBeat.Time), nil
	})
	if err != nil {
		t.Fatalf("renewals seen %v; the status heartbeat still at %v: %v", renewals, firstBeat, err)
	}
	n = getNode(t, node)
	if c := readyCondition(t, n); c.Status != corev1.ConditionTrue || n.Status.NodeInfo.BootID != own.BootID(node) || n.Status.NodeInfo.KernelVersion != kernel {
		t.Errorf("the status posts changed what the agent says: Ready %v, boot ID %q (agent %q), kernel %q", c.Status, n.Status.NodeInfo.BootID, own.BootID(node), n.Status.NodeInfo.KernelVersion)
	}
}
