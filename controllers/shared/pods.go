package shared

import (
	corev1 "k8s.io/api/core/v1"
)

// PodReady says whether a pod's Ready condition is true (and it is not being deleted).
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
