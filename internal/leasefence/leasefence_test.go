package leasefence

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"pgregory.net/rapid"
)

// Leader election timing of these tests (the proportions of controller-runtime's defaults).
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
)

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

// memLock is an in-memory Lease: each write takes `took` on the clock and fails when `fail` is set.
type memLock struct {
	id    string
	clock *clock
	rec   resourcelock.LeaderElectionRecord
	took  time.Duration
	fail  bool
}

func (l *memLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r := l.rec
	return &r, nil, nil
}
func (l *memLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.Update(ctx, rec)
}
func (l *memLock) Update(_ context.Context, rec resourcelock.LeaderElectionRecord) error {
	l.clock.advance(l.took)
	if l.fail {
		return errors.New("partitioned")
	}
	l.rec = rec
	return nil
}
func (l *memLock) RecordEvent(string) {}
func (l *memLock) Identity() string   { return l.id }
func (l *memLock) Describe() string   { return "mem/" + l.id }
func (l *memLock) renew(lock resourcelock.Interface) error {
	return lock.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: l.id})
}

func TestFenceOpensOnRenewalAndClosesAtTheRenewDeadline(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	f := New(renewDeadline, c.now)
	inner := &memLock{id: "a", clock: c}
	lock := f.Lock(inner)
	if f.Open() {
		t.Fatal("a fence that never saw a renewal is open")
	}
	if err := inner.renew(lock); err != nil {
		t.Fatal(err)
	}
	if !f.Open() {
		t.Fatal("closed right after a successful renewal")
	}
	c.advance(renewDeadline - time.Millisecond)
	if !f.Open() {
		t.Fatal("closed before the renew deadline")
	}
	c.advance(time.Millisecond)
	if f.Open() {
		t.Fatal("open at the renew deadline without another renewal")
	}
	inner.fail = true
	if err := inner.renew(lock); err == nil || f.Open() {
		t.Fatalf("a failed renewal opened the fence (err %v)", err)
	}
}

func TestFenceClosesWhenAnotherReplicaHoldsTheLease(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	f := New(renewDeadline, c.now)
	inner := &memLock{id: "a", clock: c}
	lock := f.Lock(inner)
	if err := inner.renew(lock); err != nil {
		t.Fatal(err)
	}
	inner.rec.HolderIdentity = "b" // b took the Lease over
	if _, _, err := lock.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.Open() {
		t.Fatal("open after reading that b holds the Lease")
	}
	if err := inner.renew(lock); err != nil {
		t.Fatal(err)
	}
	if err := lock.Update(context.Background(), resourcelock.LeaderElectionRecord{}); err != nil || f.Open() {
		t.Fatalf("open after releasing the Lease (err %v)", err)
	}
}

// step is one event of a leader's life in the property below.
type step struct {
	wait    time.Duration // clock advance before the step
	renew   bool          // a renewal attempt (else a write attempt)
	fail    bool          // the renewal fails (partition)
	latency time.Duration // how long the renewal's request takes
}

// admittedBeforeTakeover drives a replica through steps with lockOf's lock and reports the first
// write the fence let through at or after the earliest instant another replica may take the Lease
// over: leaseDuration after the start of the last renewal that succeeded (the other replica sees
// that renewal no earlier than its start). It returns "" when there is none.
func admittedBeforeTakeover(steps []step, lockOf func(*Fence, resourcelock.Interface) resourcelock.Interface) string {
	c := &clock{t: time.Unix(1000, 0)}
	f := New(renewDeadline, c.now)
	inner := &memLock{id: "a", clock: c}
	lock := lockOf(f, inner)
	var lastStart time.Time
	for i, s := range steps {
		c.advance(s.wait)
		if s.renew {
			inner.fail, inner.took = s.fail, s.latency
			start := c.now()
			if err := inner.renew(lock); err == nil {
				lastStart = start
			}
			continue
		}
		takeover, margin := lastStart.Add(leaseDuration), leaseDuration-renewDeadline
		if f.Open() && !c.now().Before(takeover.Add(-margin)) {
			return fmt.Sprintf("step %d: a write was let through %v after the last renewal started", i, c.now().Sub(lastStart))
		}
	}
	return ""
}

func genSteps(t *rapid.T) []step {
	return rapid.SliceOfN(rapid.Custom(func(t *rapid.T) step {
		return step{
			wait:    time.Duration(rapid.Int64Range(0, int64(12*time.Second)).Draw(t, "wait")),
			renew:   rapid.Bool().Draw(t, "renew"),
			fail:    rapid.Bool().Draw(t, "fail"),
			latency: time.Duration(rapid.Int64Range(0, int64(8*time.Second)).Draw(t, "latency")),
		}
	}), 1, 40).Draw(t, "steps")
}

// TestNoWriteWithinTheMarginOfATakeover: every write the fence lets through is sent while at least
// leaseDuration − renewDeadline remains before another replica may lead, however slow or failing
// the renewals are.
func TestNoWriteWithinTheMarginOfATakeover(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		if bad := admittedBeforeTakeover(genSteps(t), (*Fence).Lock); bad != "" {
			t.Fatal(bad)
		}
	})
}

// answerCountingLock is the seeded fault: the renewal counted from its answer, not from its start.
type answerCountingLock struct {
	resourcelock.Interface
	fence *Fence
}

func (l *answerCountingLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, rec)
	if err == nil {
		l.fence.renewed(l.fence.now())
	}
	return err
}

// TestTheMarginPropertyCatchesARenewalCountedFromItsAnswer shows the property above can fail: with a
// slow renewal, a fence counting from the answer stays open too long.
func TestTheMarginPropertyCatchesARenewalCountedFromItsAnswer(t *testing.T) {
	faulty := func(f *Fence, inner resourcelock.Interface) resourcelock.Interface {
		return &answerCountingLock{Interface: inner, fence: f}
	}
	steps := []step{
		{renew: true, latency: 6 * time.Second}, // a slow renewal: sent at 0, answered at 6 s
		{wait: 6 * time.Second},                 // 12 s after it started: a write
	}
	if admittedBeforeTakeover(steps, faulty) == "" {
		t.Fatal("the seeded fault (renewal counted from its answer) was not caught")
	}
	if bad := admittedBeforeTakeover(steps, (*Fence).Lock); bad != "" {
		t.Fatal(bad)
	}
}

func TestWrapRefusesFencedWritesOnly(t *testing.T) {
	var reached []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.Method+" "+r.URL.Path)
	}))
	defer srv.Close()
	c := &clock{t: time.Unix(1000, 0)}
	f := New(renewDeadline, c.now)
	client := &http.Client{Transport: f.Wrap(http.DefaultTransport)}
	send := func(method, path string) error {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	pod := "/api/v1/namespaces/kmm/pods/w-1"
	if err := send(http.MethodGet, pod); err != nil {
		t.Fatalf("a read was fenced: %v", err)
	}
	if err := send(http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/kmm/leases"); err != nil {
		t.Fatalf("a Lease write was fenced: %v", err)
	}
	// Every replica's certificate rotator writes the conversion caBundle of the PreflightValidation CRD.
	if err := send(http.MethodPut, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/preflightvalidations.kmm.sigs.x-k8s.io"); err != nil {
		t.Fatalf("a CRD write was fenced: %v", err)
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if err := send(m, pod); !errors.Is(err, ErrFenced) {
			t.Fatalf("%s of a pod through a closed fence: err %v, want ErrFenced", m, err)
		}
	}
	inner := &memLock{id: "a", clock: c}
	if err := inner.renew(f.Lock(inner)); err != nil {
		t.Fatal(err)
	}
	if err := send(http.MethodDelete, pod); err != nil {
		t.Fatalf("a write through an open fence: %v", err)
	}
	if want := 4; len(reached) != want {
		t.Fatalf("requests that reached the server: %v, want %d", reached, want)
	}
}

// orderLog is the order in which a held write and a release happened, across goroutines.
type orderLog struct {
	mu     sync.Mutex
	events []string
}

func (o *orderLog) add(e string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
}

func (o *orderLog) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.events...)
}

// releaseLoggingLock logs the release (a write with no holder) as it reaches the Lease.
type releaseLoggingLock struct {
	resourcelock.Interface
	log *orderLog
}

func (l *releaseLoggingLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if rec.HolderIdentity == "" {
		l.log.add("release")
	}
	return l.Interface.Update(ctx, rec)
}

// releaseDuringAWrite makes replica a lead, sends one write through the fence and has the server
// hold it while the Lease is released with a context of releaseTimeout; the server answers the
// write after hold (or once the release returned, if sooner). It returns the order in which the
// write was answered and the release reached the Lease, the release's error and the Lease's holder.
func releaseDuringAWrite(t *testing.T, lockOf func(*Fence, resourcelock.Interface) resourcelock.Interface,
	releaseTimeout, hold time.Duration) releaseOutcome {
	t.Helper()
	log := &orderLog{}
	arrived, answer := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(arrived)
		<-answer
		log.add("write answered")
	}))
	defer srv.Close()
	c := &clock{t: time.Unix(1000, 0)}
	f := New(renewDeadline, c.now)
	inner := &memLock{id: "a", clock: c}
	lock := lockOf(f, &releaseLoggingLock{Interface: inner, log: log})
	if err := inner.renew(lock); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: f.Wrap(http.DefaultTransport)}
	wrote := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPatch, srv.URL+"/api/v1/nodes/node-01", nil)
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		wrote <- err
	}()
	<-arrived
	released := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		released <- lock.Update(ctx, resourcelock.LeaderElectionRecord{})
	}()
	var relErr error
	select {
	case relErr = <-released:
		close(answer)
	case <-time.After(hold):
		close(answer)
		relErr = <-released
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the held write: %v", err)
	}
	return releaseOutcome{order: fmt.Sprint(log.list()), err: relErr, holder: inner.rec.HolderIdentity}
}

// releaseOutcome is what releaseDuringAWrite saw.
type releaseOutcome struct {
	order  string // the write's answer and the release, in the order they happened
	err    error  // the release's
	holder string // the Lease's, after the release
}

// TestAReleaseWaitsForTheWritesInFlight: a release lets another replica lead at once, so it must
// reach the Lease only after every write the fence let through was answered; when its context
// ends first it is not sent, and the Lease stays with the replica until it expires.
func TestAReleaseWaitsForTheWritesInFlight(t *testing.T) {
	got := releaseDuringAWrite(t, (*Fence).Lock, time.Minute, 200*time.Millisecond)
	if got.err != nil || got.order != "[write answered release]" || got.holder != "" {
		t.Fatalf("release with a write in flight: %+v; want the write answered first, then the release", got)
	}
	got = releaseDuringAWrite(t, (*Fence).Lock, 50*time.Millisecond, time.Minute)
	if got.err == nil || got.order != "[write answered]" || got.holder != "a" {
		t.Fatalf("release whose context ends before the write is answered: %+v; want no release sent, an error, the Lease still a's", got)
	}
}

// releaseAtOnceLock is the seeded fault: it closes the fence and releases the Lease without
// waiting for the writes in flight.
type releaseAtOnceLock struct {
	resourcelock.Interface
	fence *Fence
}

func (l *releaseAtOnceLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if rec.HolderIdentity == l.Identity() {
		return l.fence.Lock(l.Interface).Update(ctx, rec)
	}
	l.fence.close()
	return l.Interface.Update(ctx, rec)
}

// TestTheReleaseOrderCatchesAReleaseThatDoesNotWait shows the test above can fail.
func TestTheReleaseOrderCatchesAReleaseThatDoesNotWait(t *testing.T) {
	faulty := func(f *Fence, inner resourcelock.Interface) resourcelock.Interface {
		return &releaseAtOnceLock{Interface: inner, fence: f}
	}
	if got := releaseDuringAWrite(t, faulty, time.Minute, 5*time.Second); got.order != "[release write answered]" {
		t.Fatalf("the seeded fault (release without waiting) was not caught: %+v", got)
	}
}
