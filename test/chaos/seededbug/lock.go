package seededbug

import (
	"context"
	"encoding/json"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// stubbornLock is KeepLeading's wrapper of the bare Lease lock: once it has held the Lease it
// believes it still does — a failed read answers with its own record, a failed write is taken as
// done, another holder is read as itself.
type stubbornLock struct {
	resourcelock.Interface
	mu   sync.Mutex
	held bool
	last resourcelock.LeaderElectionRecord
}

// Get reads the Lease; once held, a failed read or another holder is answered with this lock's own
// record, renewed now.
func (l *stubbornLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.Interface.Get(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && rec.HolderIdentity == l.Identity() {
		l.held, l.last = true, *rec
		return rec, raw, nil
	}
	if !l.held {
		return rec, raw, err
	}
	mine := l.last
	if rec != nil {
		mine = *rec
	}
	mine.HolderIdentity, mine.RenewTime = l.Identity(), metav1.Now()
	b, jerr := json.Marshal(mine)
	return &mine, b, jerr
}

// Create creates the Lease (see wrote).
func (l *stubbornLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.wrote(rec, l.Interface.Create(ctx, rec))
}

// Update writes the Lease (see wrote).
func (l *stubbornLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.wrote(rec, l.Interface.Update(ctx, rec))
}

// wrote is the bug on a write of the Lease: once one has succeeded, every later one is taken as done
// (leader election renews by writing alone while it believes it leads, so the lie holds).
func (l *stubbornLock) wrote(rec resourcelock.LeaderElectionRecord, err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && rec.HolderIdentity == l.Identity() {
		l.held = true
	}
	if l.held {
		l.last = rec
		return nil
	}
	return err
}
