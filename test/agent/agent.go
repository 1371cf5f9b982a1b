package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// DefaultInterval is how often the agent looks again, without a watch event, at the pods that wait
// for time to pass (RunDelay, Hold).
const DefaultInterval = 50 * time.Millisecond

// Options tune an Agent. The zero value is usable.
type Options struct {
	// RunDelay is how long a worker pod runs before it completes; the pod is Running meanwhile.
	// Zero completes a pod as soon as the agent sees it (Pending straight to Succeeded or Failed).
	RunDelay time.Duration
	// RunDelayFor, when set, is how long each worker pod runs instead of RunDelay (a pull time
	// drawn per pod, issue 41). Like Outcome, it is called with the agent's lock held: it must be
	// fast, must not call the Agent, and should give a pod the same time on every call.
	RunDelayFor func(pod *corev1.Pod) time.Duration
	// Outcome decides how a run ends; nil means DefaultOutcome. SetOutcome replaces it.
	Outcome OutcomeFunc
	// Hold keeps a worker pod Running, not completed, while it returns true; nil holds nothing.
	// Deletion and reboots still end a held pod. SetHold replaces it. Like Outcome, it is called
	// with the agent's lock held: it must be fast and must not call the Agent.
	Hold func(pod *corev1.Pod) bool
	// Interval is how often the agent looks again, without a watch event, at the pods that wait for
	// time to pass (RunDelay, Hold) or whose sync failed; zero means DefaultInterval.
	Interval time.Duration
	// Clock is the agent's time source; nil means the real clock.
	Clock clock.WithTicker
	// Log receives the errors the agent retries; the zero Logger discards them.
	Log logr.Logger
	// StopDelay is how long a deleted pod that is not a worker pod (a device plugin, a workload)
	// goes on running before the agent confirms its deletion, as a kubelet first waits for its
	// containers to stop on SIGTERM; zero confirms it at once.
	StopDelay time.Duration
	// Workers is how many worker pods the agent ends at once (scale tests with thousands of pods).
	// Zero or one ends them one at a time with the agent's lock held throughout, which orders every
	// run against Reboot, SetKernel and SetReady. Above one, the API writes of a run happen without
	// the lock: a reboot may then race with a run that already decided (the run's write loses if the
	// reboot failed the pod first). Outcome and Hold are still called with the lock held.
	Workers int
	// RealNodes has the Nodes' status look like a real kubelet's (issue 41, item 3): addresses,
	// capacity, every condition, the system info and a list of 50 images.
	RealNodes bool
	// LeasePeriod, when positive, renews each node's Lease (namespace kube-node-lease) that often,
	// as a kubelet does every 10 s; StatusPeriod posts each node's status again that often (new
	// heartbeat times; a kubelet does when something changed, and at least every 5 min). Both are
	// spread evenly over the period.
	LeasePeriod, StatusPeriod time.Duration
	// PodSelector, when set, restricts the pods the agent watches (and so runs, confirms and
	// deletes) to those it selects: a scale test's unrelated pods are then neither cached nor
	// looked at.
	PodSelector labels.Selector
}

// Run records one worker pod the agent ended, successfully or not.
type Run struct {
	// Node is the node the pod ran on.
	Node string
	// Namespace of the worker pod.
	Namespace string
	// Pod is the name of the worker pod.
	Pod string
	// UID tells apart pods of the same name.
	UID types.UID
	// Module is "<namespace>/<name>" of the Module.
	Module string
	// Action is load or unload.
	Action contract.Action
	// Result is what the agent wrote as the termination message.
	Result contract.Result
	// Time is when the agent ended the pod.
	Time time.Time
}

// Agent is the simulated kubelet of the nodes it manages. Create it with New, run it with Start.
type Agent struct {
	cfg    *rest.Config
	scheme *runtime.Scheme
	client client.Client
	clock  clock.WithTicker
	log    logr.Logger
	opts   Options
	wake   chan struct{}
	// changes is what the informers and the agent's calls reported for the next pass of the loop.
	changes changes

	// Only the loop (Start) touches these.
	waiting  podSet    // pods to look at again on the next tick
	lastFull time.Time // when the loop last looked at everything

	mu      sync.Mutex
	outcome OutcomeFunc
	hold    func(*corev1.Pod) bool
	// validation decides how a validation pod ends (nil: it succeeds).
	validation func(*corev1.Pod) (ok bool, message string)
	nodes      map[string]*nodeState
	seen       map[types.UID]time.Time // when a pod was first seen runnable
	finished   map[types.UID]bool      // pods the agent ended
	deleted    map[types.UID]bool      // pods whose deletion the agent confirmed
	stopping   map[types.UID]time.Time // when the deletion of a pod other than a worker pod was seen (StopDelay)
	runs       []Run
	started    bool
}

// New returns an Agent that reaches the API server with cfg. It manages no node until AddNode.
func New(cfg *rest.Config, opts Options) (*Agent, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the agent's client: %w", err)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Outcome == nil {
		opts.Outcome = DefaultOutcome
	}
	return &Agent{
		cfg: cfg, scheme: scheme, client: c, clock: opts.Clock, log: opts.Log, opts: opts,
		wake:    make(chan struct{}, 1),
		waiting: podSet{},
		outcome: opts.Outcome, hold: opts.Hold,
		nodes: map[string]*nodeState{}, seen: map[types.UID]time.Time{},
		finished: map[types.UID]bool{}, deleted: map[types.UID]bool{}, stopping: map[types.UID]time.Time{},
	}, nil
}

// Client is the agent's direct (uncached) client, for tests that want one.
func (a *Agent) Client() client.Client { return a.client }

// SetOutcome replaces Options.Outcome for the runs that end from now on; nil restores DefaultOutcome.
func (a *Agent) SetOutcome(f OutcomeFunc) {
	if f == nil {
		f = DefaultOutcome
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.outcome = f
	a.changes.requestFull()
	a.poke()
}

// SetValidationOutcome decides how the rollout's validation pods (label contract.LabelValidation)
// that end from now on end: succeeded, or failed with message as the container's termination
// message. nil: every one succeeds.
func (a *Agent) SetValidationOutcome(f func(pod *corev1.Pod) (ok bool, message string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.validation = f
	a.changes.requestFull()
	a.poke()
}

// SetHold replaces Options.Hold; nil holds nothing.
func (a *Agent) SetHold(f func(pod *corev1.Pod) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hold = f
	a.changes.requestFull()
	a.poke()
}

// Start runs the agent until ctx is done: it watches worker pods and nodes and acts on them. It
// returns nil when ctx ends and an error when the watches cannot start. It may be called once; an
// Agent is a controller-runtime manager.Runnable, so mgr.Add(agent) works too.
func (a *Agent) Start(ctx context.Context) error {
	a.mu.Lock()
	if a.started {
		a.mu.Unlock()
		return errors.New("the agent was already started")
	}
	a.started = true
	a.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := a.startCache(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the watches were up (a short test run)
		}
		return err
	}
	if a.opts.LeasePeriod > 0 || a.opts.StatusPeriod > 0 {
		done := make(chan struct{})
		go func() { defer close(done); a.heartbeats(ctx) }()
		defer func() { cancel(); <-done }()
	}
	ticker := a.clock.NewTicker(a.opts.Interval)
	defer ticker.Stop()
	tick := true
	for {
		a.pass(ctx, c, tick)
		select {
		case <-ctx.Done():
			return nil
		case <-a.wake:
			tick = false
		case <-ticker.C():
			tick = true
		}
	}
}

// NeedLeaderElection says that the agent runs in a manager whether or not it leads: it is not
// part of the operator.
func (a *Agent) NeedLeaderElection() bool { return false }

// startCache starts informers on bound pods and on nodes whose events tell the loop what changed.
func (a *Agent) startCache(ctx context.Context) (cache.Cache, error) {
	c, err := cache.New(a.cfg, cache.Options{
		Scheme: a.scheme,
		ByObject: map[client.Object]cache.ByObject{
			// Every pod bound to a node: worker pods, device plugin pods and workloads.
			&corev1.Pod{}: {Field: fields.OneTermNotEqualSelector("spec.nodeName", ""), Label: a.opts.PodSelector},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the agent's cache: %w", err)
	}
	if err := c.IndexField(ctx, &corev1.Pod{}, nodeNameField, podNodeName); err != nil {
		return nil, fmt.Errorf("indexing pods by node: %w", err)
	}
	for obj, handler := range map[client.Object]toolscache.ResourceEventHandler{
		&corev1.Pod{}: a.podHandler(), &corev1.Node{}: a.nodeHandler(),
	} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("watching %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, fmt.Errorf("watching %T: %w", obj, err)
		}
	}
	go func() {
		if err := c.Start(ctx); err != nil {
			a.log.Error(err, "The agent's cache stopped")
		}
	}()
	if !c.WaitForCacheSync(ctx) {
		return nil, errors.New("the agent's cache did not sync")
	}
	return c, nil
}

// poke wakes the loop without blocking.
func (a *Agent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Runs returns every worker pod the agent ended, oldest first.
func (a *Agent) Runs() []Run {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Run(nil), a.runs...)
}

// RunCount is how many worker pods for module ("<namespace>/<name>") the agent ended on node.
func (a *Agent) RunCount(node, module string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.runs {
		if r.Node == node && r.Module == module {
			n++
		}
	}
	return n
}

// Loaded returns a copy of the modules the simulated kernel of node has loaded, by
// "<namespace>/<name>" of the Module; nil for a node the agent does not manage.
func (a *Agent) Loaded(node string) map[string]kmmv1beta1.ModuleConfig {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.nodes[node]
	if st == nil {
		return nil
	}
	out := make(map[string]kmmv1beta1.ModuleConfig, len(st.loaded))
	for k, v := range st.loaded {
		out[k] = *v.DeepCopy()
	}
	return out
}
