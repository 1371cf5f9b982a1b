package retry

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// maxDelayAfter is the longest delay a limiter asks for over n failures of one object in a row.
func maxDelayAfter(l workqueue.TypedRateLimiter[reconcile.Request], n int) time.Duration {
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "node-1"}}
	var longest time.Duration
	for range n {
		longest = max(longest, l.When(req))
	}
	return longest
}

func TestLimiterCapsTheDelay(t *testing.T) {
	if got := maxDelayAfter(Limiter(), 40); got != MaxDelay {
		t.Fatalf("longest delay over 40 failures = %v, want the cap %v", got, MaxDelay)
	}
	// The fault this cap removes: controller-runtime's default limiter waits far longer.
	if got := maxDelayAfter(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](), 40); got <= MaxDelay {
		t.Fatalf("controller-runtime's default waits %v at most: the check above could not fail", got)
	}
}

func TestLimiterForgetsOnSuccess(t *testing.T) {
	l := Limiter()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "node-1"}}
	for range 10 {
		l.When(req)
	}
	l.Forget(req)
	if got := l.When(req); got > BaseDelay {
		t.Fatalf("first delay after a success = %v, want at most %v", got, BaseDelay)
	}
}
