package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kmm-project/kmm/test/poll"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestDaemonSetPodsRunOnAgentNodes checks the agent with kube-controller-manager and kube-scheduler:
// a DaemonSet's pod is scheduled onto a simulated node (its not-ready taint cleared), becomes
// Running and Ready so that the DaemonSet counts it available, and goes away when the node label
// the DaemonSet selects on is removed.
func TestDaemonSetPodsRunOnAgentNodes(t *testing.T) {
	ctx := context.Background()
	name := "ds-node"
	if err := ag.AddNode(ctx, name, "6.1.0-1", map[string]string{"dp": "yes"}); err != nil {
		t.Fatal(err)
	}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "dp", Namespace: "default"}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "dp"}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "dp"}},
			Spec:       corev1.PodSpec{NodeSelector: map[string]string{"dp": "yes"}, Containers: []corev1.Container{{Name: "c", Image: "reg/dp:1"}}},
		},
	}}
	if err := k8s.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		got := &appsv1.DaemonSet{}
		_ = k8s.Get(ctx, client.ObjectKeyFromObject(ds), got)
		return got.Status.NumberAvailable == 1, fmt.Sprintf("DaemonSet status %+v", got.Status)
	})
	node := &corev1.Node{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		t.Fatal(err)
	}
	delete(node.Labels, "dp")
	if err := k8s.Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, func() (bool, string) {
		pods := &corev1.PodList{}
		_ = k8s.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": "dp"})
		return len(pods.Items) == 0, fmt.Sprintf("%d device plugin pods left", len(pods.Items))
	})
	if err := k8s.Delete(ctx, ds); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	poll.Until(t, timeout, 100*time.Millisecond, cond)
}
