package app

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/internal/leasefence"
)

// TestLeaderWritesAreFencedByItsLease runs the manager with leader election on a real API server:
// once it leads, its client writes; once another replica holds the Lease, the same client's
// writes are refused before they are sent (internal/leasefence), although the process has not
// exited. Without the fence wired into New (the seeded fault: no cfg.Wrap), the last write goes
// through and the test fails.
func TestLeaderWritesAreFencedByItsLease(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ns = "kmm-fence"
	env, admin, o := electionBed(ctx, t, ns)
	mgr, err := New(env.Config, o)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	select {
	case <-mgr.Elected():
	case <-ctx.Done():
		t.Fatal("the manager never led")
	}
	c := mgr.GetClient()
	cm := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	if err := c.Create(ctx, cm("while-leading")); err != nil {
		t.Fatalf("a write while leading: %v", err)
	}

	// Another replica takes the Lease over (again on a conflict: the manager renews every 200 ms).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var lease coordinationv1.Lease
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: LeaderElectionID}, &lease); err != nil {
			return err
		}
		now := metav1.NewMicroTime(time.Now())
		lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.AcquireTime = ptr.To("thief"), &now, &now
		lease.Spec.LeaseDurationSeconds = ptr.To(int32(3600))
		return admin.Update(ctx, &lease)
	})
	if err != nil {
		t.Fatal(err)
	}
	stolen := time.Now()
	deadline := stolen.Add(o.RenewDeadline + time.Second)
	for {
		err := c.Create(ctx, cm("after-"+time.Now().Format("150405.000000")))
		if errors.Is(err, leasefence.ErrFenced) {
			t.Logf("writes refused %v after the Lease was taken over", time.Since(stolen).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a write %v after another replica took the Lease: err %v, want leasefence.ErrFenced", time.Since(stolen), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-stopped:
		t.Logf("the manager stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the manager did not stop after losing its Lease")
	}
}

// renewalsTakenAsDone is a Lease lock whose writes, once skip is set, are answered as done without
// being sent: to the lock above it every renewal succeeds, while the Lease is no longer renewed.
type renewalsTakenAsDone struct {
	resourcelock.Interface
	skip *atomic.Bool
}

func (l renewalsTakenAsDone) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	if l.skip.Load() {
		return nil
	}
	return l.Interface.Update(ctx, rec)
}

// TestInstrumentedLockIsUnderTheFence sets Options.Instrument to wrap the Lease lock with one that,
// once the manager leads, answers its renewals as done without sending them: the lease fence, which
// New puts around the lock Instrument leaves, takes the lock's word and lets the client's writes
// through past the renew deadline (what test/chaos's seeded bug keep-leading needs; nothing else
// replaces the Lease here). With the fence around the bare lock under Instrument's wrapper (the
// seeded fault), it sees no renewal and refuses the writes once the renew deadline has passed.
func TestInstrumentedLockIsUnderTheFence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ns = "kmm-instrument"
	env, _, o := electionBed(ctx, t, ns)
	var skip atomic.Bool
	o.Instrument = func(mo *ctrl.Options) {
		mo.LeaderElectionResourceLockInterface = renewalsTakenAsDone{Interface: mo.LeaderElectionResourceLockInterface, skip: &skip}
	}
	mgr, err := New(env.Config, o)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	select {
	case <-mgr.Elected():
	case <-ctx.Done():
		t.Fatal("the manager never led")
	}
	c := mgr.GetClient()
	skip.Store(true)
	skipping := time.Now()
	for time.Since(skipping) < o.RenewDeadline+time.Second {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "w-" + time.Now().Format("150405.000000")}}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatalf("a write %v after the lock began to answer renewals itself: %v (the fence must follow the lock Instrument leaves)",
				time.Since(skipping).Round(time.Millisecond), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
