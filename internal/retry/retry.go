// Package retry is the back-off every kmm controller retries a failed reconcile with.
//
// controller-runtime's default limiter doubles a failing object's delay from 5 ms up to 1,000 s:
// after a burst of API server errors (429s, 5xx, an outage) a node's reconcile could wait a quarter
// of an hour after the API server came back (found by make chaos, docs/reliability.md). kmm caps
// the per-object delay at MaxDelay instead, the cap its conflict retries already had.
package retry

import (
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const (
	// BaseDelay is the delay after an object's first failure; it doubles with each failure in a row.
	BaseDelay = 10 * time.Millisecond
	// MaxDelay bounds the delay of any one object's retry.
	MaxDelay = 30 * time.Second
	// overallQPS and overallBurst bound the retries of all objects together (client-go's default).
	overallQPS, overallBurst = 10, 100
)

// Limiter returns a new rate limiter for one controller: per object, BaseDelay doubling up to
// MaxDelay (forgotten once a reconcile of the object succeeds); overall, 10 retries a second with
// bursts of 100.
func Limiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](BaseDelay, MaxDelay),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(overallQPS), overallBurst)},
	)
}
