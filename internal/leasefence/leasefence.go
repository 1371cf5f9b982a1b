// Package leasefence keeps an operator replica that may have lost its leader election Lease from
// writing to the API server.
//
// Kubernetes leader election has no fencing: a leader that cannot renew its Lease (partitioned,
// paused, starved of CPU) stops leading only when its renew deadline has passed, and the reconciles
// it has in flight may still send writes after another replica has taken the Lease over. A Fence
// closes that gap on the sending side. It watches the Lease writes of its own replica (Lock) and
// lets the replica's other writes through (Wrap) only while the last successful renewal *started*
// less than the renew deadline ago. Another replica takes the Lease over only once the lease
// duration has passed since it saw that renewal, which it cannot see before the renewal started,
// so every write the fence lets through leaves the replica at least leaseDuration − renewDeadline
// before any other replica can lead: the margin for the request to reach the API server.
//
// A release (the Lease written with no holder, which controller-runtime's ReleaseOnCancel does on
// shutdown and when a renewal fails) lets another replica lead at once, so that margin does not
// hold for it: the fence closes, then the release waits until every write it let through has been
// answered. The wait is bounded by the release's context (client-go gives it the renew deadline);
// when that ends first the release is not sent, and the Lease expires as it would without one.
//
// Reads are never fenced, nor are the writes every replica makes whether it leads or not: the
// Lease itself, the webhook's serving certificate (its Secret and the webhook configurations'
// caBundle, kept by every replica) and the TokenReviews and SubjectAccessReviews of the metrics
// endpoint's authentication.
package leasefence

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kmm-project/kmm/internal/apipath"
)

// ErrFenced is the error of a write refused because the replica cannot prove it still leads.
var ErrFenced = errors.New("leasefence: write refused: this replica's leader election Lease was not renewed within the renew deadline")

// unfenced are the resources every replica writes, leading or not.
var unfenced = map[string]bool{
	"leases":                          true,
	"secrets":                         true,
	"validatingwebhookconfigurations": true,
	"mutatingwebhookconfigurations":   true,
	// the certificate rotator of every replica injects the CA into the PreflightValidation CRD's
	// conversion webhook, as into the webhook configuration
	"customresourcedefinitions": true,
	"tokenreviews":              true,
	"subjectaccessreviews":      true,
}

// Fence decides whether its replica may write. The zero value is closed; use New.
type Fence struct {
	renewDeadline time.Duration
	now           func() time.Time

	mu        sync.Mutex
	openUntil time.Time     // zero: closed
	inFlight  int           // writes let through and not answered yet
	idle      chan struct{} // closed when inFlight drops to 0 (nil: nobody waits)
}

// New is a closed fence whose renewals keep it open for renewDeadline (the leader election's
// RenewDeadline). now is the clock (time.Now when nil).
func New(renewDeadline time.Duration, now func() time.Time) *Fence {
	if now == nil {
		now = time.Now
	}
	return &Fence{renewDeadline: renewDeadline, now: now}
}

// Open says whether a write may be sent now.
func (f *Fence) Open() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.openNow()
}

// openNow says whether the fence is open now (f.mu held).
func (f *Fence) openNow() bool { return f.now().Before(f.openUntil) }

// admit counts a write in flight if the fence is open, and says whether it is.
func (f *Fence) admit() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.openNow() {
		return false
	}
	f.inFlight++
	return true
}

// answered records that a write admit let through has its answer (or its error).
func (f *Fence) answered() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	if f.inFlight == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// settled waits until every write the fence let through has been answered, or ctx ends.
func (f *Fence) settled(ctx context.Context) error {
	f.mu.Lock()
	if f.inFlight == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle, n := f.idle, f.inFlight
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("leasefence: Lease not released: %d writes still unanswered: %w", n, ctx.Err())
	}
}

// renewed records a Lease write for this replica that succeeded and started at start.
func (f *Fence) renewed(start time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if until := start.Add(f.renewDeadline); until.After(f.openUntil) {
		f.openUntil = until
	}
}

// close shuts the fence: the Lease names another holder, or was released.
func (f *Fence) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.openUntil = time.Time{}
}

// Lock wraps the leader election lock so that the fence follows its writes.
func (f *Fence) Lock(inner resourcelock.Interface) resourcelock.Interface {
	return &fencedLock{Interface: inner, fence: f}
}

// fencedLock opens the fence on each successful Lease write naming this replica, and closes it
// on any Lease write naming another holder or none (a release) and on a read of a Lease another
// replica holds.
type fencedLock struct {
	resourcelock.Interface
	fence *Fence
}

func (l *fencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	if err == nil && rec != nil && rec.HolderIdentity != l.Identity() {
		l.fence.close()
	}
	return rec, raw, err
}

func (l *fencedLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, func() error { return l.Interface.Create(ctx, rec) })
}

func (l *fencedLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, func() error { return l.Interface.Update(ctx, rec) })
}

// write runs a Lease write and moves the fence by its outcome; the renewal counts from before the
// request was sent, never from its answer. A release is sent only once the fence is closed and
// every write it let through has been answered.
func (l *fencedLock) write(ctx context.Context, rec resourcelock.LeaderElectionRecord, send func() error) error {
	start := l.fence.now()
	if rec.HolderIdentity != l.Identity() {
		l.fence.close()
		if err := l.fence.settled(ctx); err != nil {
			return err
		}
		return send()
	}
	err := send()
	if err == nil {
		l.fence.renewed(start)
	}
	return err
}

// Wrap is a transport wrapper (rest.Config.Wrap) that refuses a fenced write while the fence is
// closed, with ErrFenced, before it reaches the network, and counts the writes it lets through
// until they are answered (a release waits for them).
func (f *Fence) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{next: rt, fence: f}
}

type roundTripper struct {
	next  http.RoundTripper
	fence *Fence
}

// WrappedRoundTripper lets client-go reach the transport below (to cancel a request, for one).
func (t roundTripper) WrappedRoundTripper() http.RoundTripper { return t.next }

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if !Fenced(req.Method, req.URL.Path) {
		return t.next.RoundTrip(req)
	}
	if !t.fence.admit() {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, ErrFenced)
	}
	defer t.fence.answered()
	return t.next.RoundTrip(req)
}

// Fenced says whether a request needs the fence open: every write but those to the resources
// every replica writes.
func Fenced(method, path string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return !unfenced[apipath.Resource(path)]
}
