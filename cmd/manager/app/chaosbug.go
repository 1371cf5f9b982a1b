package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kmm-project/kmm/internal/chaosbug"
)

// seededLeaderLock is the Lease lock of the seeded bug chaosbug.KeepLeading, nil (controller-runtime
// builds its own) in every other case, production builds included.
func seededLeaderLock(cfg *rest.Config, o Options) (resourcelock.Interface, error) {
	if !o.LeaderElect || !chaosbug.Enabled(chaosbug.KeepLeading) {
		return nil, nil
	}
	if o.LeaderElectNamespace == "" {
		return nil, errors.New("the seeded bug keep-leading needs --leader-elect-namespace")
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.LeaderElectNamespace, LeaderElectionID, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: host + "_" + string(uuid.NewUUID())})
	if err != nil {
		return nil, fmt.Errorf("building the leader election lock: %w", err)
	}
	return &stubbornLock{Interface: lock}, nil
}

// stubbornLock is the bug: once it has held the Lease it believes it still does — a failed read
// answers with its own record, a failed write is taken as done, another holder is read as itself.
type stubbornLock struct {
	resourcelock.Interface
	mu   sync.Mutex
	held bool
	last resourcelock.LeaderElectionRecord
}

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

func (l *stubbornLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.wrote(rec, l.Interface.Create(ctx, rec))
}

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
