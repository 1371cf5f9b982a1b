package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kmm-project/kmm/test/poll"
)

// pollInterval is how often the wait helpers look: the kubelet reports pod status changes within
// about a second.
const pollInterval = 250 * time.Millisecond

// WaitNodeReady waits until the node's Ready condition is True.
func (c *Cluster) WaitNodeReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	poll.Until(t, timeout, pollInterval, func() (bool, string) {
		n, err := c.clientset.CoreV1().Nodes().Get(context.Background(), c.nodeName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("node %s: %v", c.nodeName, err)
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, fmt.Sprintf("node %s Ready=%s: %s", c.nodeName, cond.Status, cond.Message)
			}
		}
		return false, fmt.Sprintf("node %s has no Ready condition", c.nodeName)
	})
}

// WaitPodPhase waits until the pod is in phase and returns it; it fails at once when the pod
// ends in another phase, with its container states.
func (c *Cluster) WaitPodPhase(t testing.TB, namespace, name string, phase corev1.PodPhase, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll.Until(t, timeout, pollInterval, func() (bool, string) {
		p, err := c.clientset.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("pod %s/%s: %v", namespace, name, err)
		}
		pod = p
		terminal := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if terminal && p.Status.Phase != phase {
			t.Fatalf("pod %s/%s ended %s, want %s: %s", namespace, name, p.Status.Phase, phase, describePod(p))
		}
		return p.Status.Phase == phase, fmt.Sprintf("pod %s/%s is %s, want %s: %s", namespace, name, p.Status.Phase, phase, describePod(p))
	})
	return pod
}

// WaitDaemonSetReady waits until the DaemonSet has at least one pod scheduled and every
// scheduled pod is up to date and ready.
func (c *Cluster) WaitDaemonSetReady(t testing.TB, namespace, name string, timeout time.Duration) {
	t.Helper()
	poll.Until(t, timeout, pollInterval, func() (bool, string) {
		ds, err := c.clientset.AppsV1().DaemonSets(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("DaemonSet %s/%s: %v", namespace, name, err)
		}
		s := ds.Status
		ok := s.ObservedGeneration == ds.Generation && s.DesiredNumberScheduled > 0 &&
			s.NumberReady == s.DesiredNumberScheduled && s.UpdatedNumberScheduled == s.DesiredNumberScheduled
		return ok, fmt.Sprintf("DaemonSet %s/%s: desired %d, ready %d, updated %d", namespace, name, s.DesiredNumberScheduled, s.NumberReady, s.UpdatedNumberScheduled)
	})
}

// WaitNoPods waits until no pod in namespace matches the label selector (deleted, not only
// terminating).
func (c *Cluster) WaitNoPods(t testing.TB, namespace, selector string, timeout time.Duration) {
	t.Helper()
	poll.Until(t, timeout, pollInterval, func() (bool, string) {
		pods, err := c.clientset.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, fmt.Sprintf("pods %s in %s: %v", selector, namespace, err)
		}
		names := make([]string, 0, len(pods.Items))
		for _, p := range pods.Items {
			names = append(names, p.Name+" ("+string(p.Status.Phase)+")")
		}
		return len(pods.Items) == 0, fmt.Sprintf("pods %s in %s still there: %v", selector, namespace, names)
	})
}

// describePod is a pod's conditions and container states, for failure messages.
func describePod(p *corev1.Pod) string {
	s := p.Status.Reason + " " + p.Status.Message
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			s += fmt.Sprintf(" [%s=%s %s]", cond.Type, cond.Status, cond.Message)
		}
	}
	for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		switch st := cs.State; {
		case st.Waiting != nil:
			s += fmt.Sprintf(" %s: waiting %s %s;", cs.Name, st.Waiting.Reason, st.Waiting.Message)
		case st.Terminated != nil:
			s += fmt.Sprintf(" %s: exit %d %s %q;", cs.Name, st.Terminated.ExitCode, st.Terminated.Reason, st.Terminated.Message)
		case st.Running != nil:
			s += fmt.Sprintf(" %s: running;", cs.Name)
		}
	}
	return s
}
