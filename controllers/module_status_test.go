package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func TestModuleEventOnlyWhenTheSummaryChanges(t *testing.T) {
	conds := func(ready, degraded metav1.ConditionStatus, readyReason, degradedReason, msg string) []metav1.Condition {
		return []metav1.Condition{
			{Type: kmmv1beta1.ConditionReady, Status: ready, Reason: readyReason, Message: msg},
			{Type: kmmv1beta1.ConditionDegraded, Status: degraded, Reason: degradedReason, Message: "degraded: " + msg},
		}
	}
	f, tr := metav1.ConditionFalse, metav1.ConditionTrue
	inProgress := func(msg string) []metav1.Condition {
		return conds(f, f, kmmv1beta1.ReasonInProgress, kmmv1beta1.ReasonAsExpected, msg)
	}
	allLoaded := conds(tr, f, kmmv1beta1.ReasonAllLoaded, kmmv1beta1.ReasonAsExpected, "loaded on 3 of 3 nodes")
	failing := conds(f, tr, kmmv1beta1.ReasonWorkerFailing, kmmv1beta1.ReasonWorkerFailing, "node-1")
	tests := []struct {
		name       string
		prev, next []metav1.Condition
		want       *kubeEvent
	}{
		{"a new Module starts loading", nil, inProgress("loaded on 0 of 3 nodes"),
			&kubeEvent{corev1.EventTypeNormal, kmmv1beta1.ReasonInProgress, "loaded on 0 of 3 nodes"}},
		{"progress alone is not an Event", inProgress("loaded on 0 of 3 nodes"), inProgress("loaded on 2 of 3 nodes"), nil},
		{"every node loaded", inProgress("loaded on 2 of 3 nodes"), allLoaded,
			&kubeEvent{corev1.EventTypeNormal, kmmv1beta1.ReasonAllLoaded, "loaded on 3 of 3 nodes"}},
		{"a worker fails", allLoaded, failing,
			&kubeEvent{corev1.EventTypeWarning, kmmv1beta1.ReasonWorkerFailing, "degraded: node-1"}},
		{"still failing", failing, failing, nil},
		{"recovered", failing, allLoaded,
			&kubeEvent{corev1.EventTypeNormal, kmmv1beta1.ReasonAllLoaded, "loaded on 3 of 3 nodes"}},
		{"no conditions", allLoaded, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := moduleEvent(tt.prev, tt.next)
			switch {
			case tt.want == nil && ok:
				t.Errorf("got Event %+v, want none", got)
			case tt.want != nil && (!ok || got != *tt.want):
				t.Errorf("got %+v (emitted %v), want %+v", got, ok, *tt.want)
			}
		})
	}
}
