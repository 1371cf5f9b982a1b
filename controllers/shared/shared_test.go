package shared

import (
	"context"
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
)

func TestConflictsRequeueQuietlyWithBackOff(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "nodemodulesconfigs"}, "n1", errors.New("changed"))
	other := errors.New("boom")
	for _, tc := range []struct {
		name  string
		err   error
		quiet bool
	}{
		{"conflict", conflict, true},
		{"wrapped conflict", fmt.Errorf("writing status: %w", conflict), true},
		{"joined conflicts", errors.Join(conflict, nil, fmt.Errorf("apply: %w", conflict)), true},
		{"a conflict and a failure", errors.Join(conflict, other), false},
		{"a failure", other, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c ConflictRetry
			req := ctrl.Request{}
			res, err := c.Result(context.Background(), req, ctrl.Result{}, tc.err)
			if tc.quiet != (err == nil) {
				t.Fatalf("error returned = %v, want quiet %v", err, tc.quiet)
			}
			if !tc.quiet {
				return
			}
			first := res.RequeueAfter
			res, _ = c.Result(context.Background(), req, ctrl.Result{}, tc.err)
			if first <= 0 || res.RequeueAfter <= first {
				t.Fatalf("requeue after %v then %v: want a growing back-off", first, res.RequeueAfter)
			}
			_, _ = c.Result(context.Background(), req, ctrl.Result{}, nil)
			if res, _ = c.Result(context.Background(), req, ctrl.Result{}, tc.err); res.RequeueAfter != first {
				t.Fatalf("after a clean reconcile the back-off restarts at %v, got %v", first, res.RequeueAfter)
			}
		})
	}
}
