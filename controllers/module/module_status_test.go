package module

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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

func TestModuleConditions(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC))
	f, tr := metav1.ConditionFalse, metav1.ConditionTrue
	loaded := func(avail, desired int32) kmmv1beta1.DaemonSetStatus {
		return kmmv1beta1.DaemonSetStatus{AvailableNumber: avail, DesiredNumber: desired}
	}
	type want struct {
		ready, progressing, degraded       metav1.ConditionStatus
		readyReason, degradedReason, inMsg string
	}
	tests := []struct {
		name      string
		problem   moduleProblem
		loader    kmmv1beta1.DaemonSetStatus
		noMapping []string
		failing   []string
		want      want
	}{
		{"all loaded", moduleProblem{}, loaded(3, 3), nil, nil,
			want{tr, f, f, kmmv1beta1.ReasonAllLoaded, kmmv1beta1.ReasonAsExpected, ""}},
		{"loading", moduleProblem{}, loaded(1, 3), nil, nil,
			want{f, tr, f, kmmv1beta1.ReasonInProgress, kmmv1beta1.ReasonAsExpected, ""}},
		{"a worker failing", moduleProblem{}, loaded(2, 3), nil, []string{"node-2 (ImagePull: x)"},
			want{f, f, tr, kmmv1beta1.ReasonWorkerFailing, kmmv1beta1.ReasonWorkerFailing, "node-2 (ImagePull: x)"}},
		{"no mapping on a node, the rest loaded", moduleProblem{}, loaded(2, 2), []string{"node-9"}, nil,
			want{tr, f, tr, kmmv1beta1.ReasonAllLoaded, kmmv1beta1.ReasonNoKernelMapping, "node-9"}},
		{"an object refused", moduleProblem{refused: "daemonsets.apps is invalid"}, loaded(2, 2), nil, nil,
			want{tr, f, tr, kmmv1beta1.ReasonAllLoaded, kmmv1beta1.ReasonObjectRefused, "is invalid"}},
		{"invalid wins over everything", moduleProblem{invalid: "spec.selector: Required", refused: "x"}, loaded(0, 3), []string{"n"}, []string{"m"},
			want{f, f, tr, kmmv1beta1.ReasonInvalidSpec, kmmv1beta1.ReasonInvalidSpec, "spec.selector"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := moduleConditions(conditionFacts{problem: tt.problem, progress: tt.loader, what: "loaded",
				noMapping: tt.noMapping, failing: tt.failing, generation: 7, now: now})
			r := meta.FindStatusCondition(got, kmmv1beta1.ConditionReady)
			p := meta.FindStatusCondition(got, kmmv1beta1.ConditionProgressing)
			d := meta.FindStatusCondition(got, kmmv1beta1.ConditionDegraded)
			if r == nil || p == nil || d == nil {
				t.Fatalf("conditions %+v", got)
			}
			if r.Status != tt.want.ready || p.Status != tt.want.progressing || d.Status != tt.want.degraded ||
				r.Reason != tt.want.readyReason || d.Reason != tt.want.degradedReason || !strings.Contains(d.Message, tt.want.inMsg) {
				t.Errorf("Ready %s/%s Progressing %s Degraded %s/%s %q; want %+v", r.Status, r.Reason, p.Status, d.Status, d.Reason, d.Message, tt.want)
			}
			for _, c := range got {
				if !c.LastTransitionTime.Equal(&now) || c.ObservedGeneration != 7 {
					t.Errorf("%s: time %v generation %d, want the injected time and 7", c.Type, c.LastTransitionTime, c.ObservedGeneration)
				}
			}
		})
	}
}

func TestStatusWriteWait(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	f, tr := metav1.ConditionFalse, metav1.ConditionTrue
	status := func(gen int64, ready metav1.ConditionStatus, reason, msg string) *kmmv1beta1.ModuleStatus {
		return &kmmv1beta1.ModuleStatus{ObservedGeneration: gen, Conditions: []metav1.Condition{
			{Type: kmmv1beta1.ConditionReady, Status: ready, Reason: reason, Message: msg},
			{Type: kmmv1beta1.ConditionDegraded, Status: f, Reason: kmmv1beta1.ReasonAsExpected},
		}}
	}
	progress := func(msg string) *kmmv1beta1.ModuleStatus { return status(1, f, kmmv1beta1.ReasonInProgress, msg) }
	tests := []struct {
		name      string
		cur, next *kmmv1beta1.ModuleStatus
		last, now time.Time
		want      time.Duration
	}{
		{"never written by this process", progress("0 of 9"), progress("1 of 9"), time.Time{}, t0, 0},
		{"progress right after a write waits for the rest of the second", progress("1 of 9"), progress("2 of 9"),
			t0, t0.Add(300 * time.Millisecond), 700 * time.Millisecond},
		{"progress a second after the last write", progress("2 of 9"), progress("3 of 9"), t0, t0.Add(time.Second), 0},
		{"all loaded is written at once", progress("8 of 9"), status(1, tr, kmmv1beta1.ReasonAllLoaded, "9 of 9"),
			t0, t0.Add(10 * time.Millisecond), 0},
		{"a new observed generation is written at once", progress("8 of 9"), status(2, f, kmmv1beta1.ReasonInProgress, "8 of 9"),
			t0, t0.Add(10 * time.Millisecond), 0},
		{"a new condition is written at once", &kmmv1beta1.ModuleStatus{ObservedGeneration: 1}, progress("0 of 9"),
			t0, t0.Add(10 * time.Millisecond), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := statusWriteWait(tt.cur, tt.next, tt.last, tt.now); got != tt.want {
				t.Errorf("wait %v, want %v", got, tt.want)
			}
		})
	}
}

func TestModuleStatusOnlyUpdatesAreDelayed(t *testing.T) {
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Generation: 1, Finalizers: []string{Finalizer}}}
	statusOnly := m.DeepCopy()
	statusOnly.Status.ObservedGeneration = 1
	statusOnly.ResourceVersion = "2"
	specChanged := m.DeepCopy()
	specChanged.Generation = 2
	deleted := m.DeepCopy()
	deleted.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	relabelled := m.DeepCopy()
	relabelled.Labels = map[string]string{"a": "b"}
	p := statusOnlyUpdate()
	for name, tt := range map[string]struct {
		next *kmmv1beta1.Module
		want bool
	}{"status": {statusOnly, true}, "spec": {specChanged, false}, "deletion": {deleted, false}, "labels": {relabelled, false}} {
		if got := p.Update(event.UpdateEvent{ObjectOld: m, ObjectNew: tt.next}); got != tt.want {
			t.Errorf("%s: statusOnlyUpdate %v, want %v", name, got, tt.want)
		}
	}
	if p.Create(event.CreateEvent{Object: m}) || p.Delete(event.DeleteEvent{Object: m}) {
		t.Error("statusOnlyUpdate passes a create or a delete")
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	delayedStatusUpdates().Update(context.Background(), event.UpdateEvent{ObjectOld: m, ObjectNew: statusOnly}, q)
	if q.Len() != 0 {
		t.Fatal("a status-only update was queued at once")
	}
	deadline := time.Now().Add(5 * StatusDelay)
	for q.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if q.Len() != 1 {
		t.Fatalf("the delayed request was not queued within %v", 5*StatusDelay)
	}
}
