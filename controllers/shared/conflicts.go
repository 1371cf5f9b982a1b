package shared

import (
	"context"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kmm-project/kmm/internal/retry"
)

// ConflictRetry turns a reconcile that failed only on optimistic-concurrency conflicts into a quiet
// requeue. A conflict says the object changed since it was read: the next reconcile decides on fresh
// facts. Returned as an error, controller-runtime would log each one as "Reconciler error", noise a
// user reads as a failure. The retry still backs off, per object, with client-go's exponential
// limiter (retry.BaseDelay doubling to retry.MaxDelay), forgotten on the next reconcile that ends otherwise.
type ConflictRetry struct {
	once    sync.Once
	limiter workqueue.TypedRateLimiter[ctrl.Request]
}

// Result is what a reconcile that returned res and err returns to controller-runtime: a quiet,
// backed-off requeue when err holds only conflicts, else res and err as they are.
func (c *ConflictRetry) Result(ctx context.Context, req ctrl.Request, res ctrl.Result, err error) (ctrl.Result, error) {
	c.once.Do(func() {
		c.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[ctrl.Request](retry.BaseDelay, retry.MaxDelay)
	})
	if err != nil && onlyConflicts(err) {
		after := c.limiter.When(req)
		ctrl.LoggerFrom(ctx).V(1).Info("Conflict: the object changed since it was read; retrying", "after", after, "error", err.Error())
		return ctrl.Result{RequeueAfter: after}, nil
	}
	c.limiter.Forget(req)
	return res, err
}

// onlyConflicts says whether err, and every error joined into it, is a conflict.
func onlyConflicts(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if e != nil && !onlyConflicts(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err)
}
