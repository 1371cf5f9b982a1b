package app

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/kmm-project/kmm/internal/leasefence"
)

// leaderElection builds the leader election lock and the fence that follows it
// (internal/leasefence), and wraps cfg's transport with the fence, so that a replica writes only
// while its last Lease renewal started less than the renew deadline ago. New puts the fence around
// the lock (Fence.Lock) once Options.Instrument has had its say. Without leader election it
// changes nothing and returns nils. events receives the lock's Events ("became leader") once the
// manager exists: bind it then.
func leaderElection(cfg *rest.Config, o Options, events *lateEvents) (resourcelock.Interface, *leasefence.Fence, error) {
	if !o.LeaderElect {
		return nil, nil, nil
	}
	renewDeadline := o.RenewDeadline
	if renewDeadline == 0 {
		renewDeadline = defaultRenewDeadline
	}
	// On a copy: NewResourceLock sets the user agent and a client timeout of half the renew
	// deadline on the config it is given, which on cfg would put that timeout on every request of
	// the manager, watches included (cut every second with a 2 s deadline, every 5 s with the
	// default), and its caches would never sync where a LIST takes longer.
	lock, err := leaderelection.NewResourceLock(rest.CopyConfig(cfg), events, leaderelection.Options{
		LeaderElection:          true,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectNamespace,
		RenewDeadline:           renewDeadline,
	})
	if err != nil {
		return nil, nil, err
	}
	fence := leasefence.New(renewDeadline, nil)
	cfg.Wrap(fence.Wrap)
	return lock, fence, nil
}

// defaultRenewDeadline is controller-runtime's default RenewDeadline, used when --leader-elect-renew-deadline is 0.
const defaultRenewDeadline = 10 * time.Second

// lateEvents is a recorder.Provider whose recorders forward to the manager's once bind is called;
// Events recorded before that are dropped.
type lateEvents struct {
	mu       sync.Mutex
	provider recorder.Provider
}

func (l *lateEvents) bind(p recorder.Provider) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.provider = p
}

func (l *lateEvents) bound() recorder.Provider {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.provider
}

// GetEventRecorderFor is a recorder that forwards to the bound provider's recorder for name.
func (l *lateEvents) GetEventRecorderFor(name string) record.EventRecorder {
	return lateRecorder{events: l, name: name}
}

// GetEventRecorder is the bound provider's recorder for name (nil before bind; the lock does not use it).
func (l *lateEvents) GetEventRecorder(name string) recorder.EventRecorder {
	if p := l.bound(); p != nil {
		return p.GetEventRecorder(name)
	}
	return nil
}

// lateRecorder forwards to the events.k8s.io recorder of events' bound provider, or drops the
// Event. Not to the core/v1 recorder (GetEventRecorderFor) the Lease lock's interface is named
// after: client-go sends core/v1 Events as JSON, where every other request kmm makes about a
// built-in kind goes as protobuf (issue 41, TestBuiltInKindsGoAsProtobuf).
type lateRecorder struct {
	events *lateEvents
	name   string
}

func (r lateRecorder) target() recorder.EventRecorder {
	if p := r.events.bound(); p != nil {
		return p.GetEventRecorder(r.name)
	}
	return nil
}

func (r lateRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.Eventf(obj, eventtype, reason, "%s", message)
}

// Eventf records the Event with its reason as the action (events.k8s.io requires one).
func (r lateRecorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if t := r.target(); t != nil {
		t.Eventf(obj, nil, eventtype, reason, reason, messageFmt, args...)
	}
}

func (r lateRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if t := r.target(); t != nil {
		t.AnnotatedEventf(obj, nil, annotations, eventtype, reason, reason, messageFmt, args...)
	}
}
