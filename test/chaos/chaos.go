// Package chaos is the fault-injection harness of issue 23 (`make chaos`): the local control plane
// (etcd and kube-apiserver from test/envtest, with kube-controller-manager and kube-scheduler), the
// test agent (test/agent) as the kubelet of N simulated nodes, and two operator replicas as
// separate processes with leader election, each reaching the API server through a proxy the
// harness controls. While Modules are loaded, upgraded in order with a drain (a version bump under
// an automatic rollout) and deleted, round after round, an injector at seeded random points kills
// a replica (SIGKILL, restarted at once), partitions the leader from the API server until it loses
// its Lease, restarts kube-apiserver and etcd (same ports, same data), and makes the proxies cut
// watch streams, answer a share of requests with 429, 500 or 409 and delay others. A watcher with
// its own client checks SPEC §4's invariants on every event (watcher.go) and every write a replica
// sends against the Lease holder; at the end every pair must converge and every cordon be lifted.
// Run returns a Report: faults by kind, checks made, violations, time to converge after the last
// fault, and writes per pair against a fault-free round.
//
// The seeded bugs of test/chaos/seededbug (planted by the manager command
// test/chaos/kmm-manager-seeded, around the real manager) show that the watcher catches what each
// kind of fault can break (bugs_test.go).
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crdenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/chaos/seededbug"
	"github.com/kmm-project/kmm/test/envtest"
)

// Namespace holds the Modules and the workload pods; LeaseNamespace the replicas' Lease.
const (
	Namespace      = "kmm-chaos"
	LeaseNamespace = "kmm-chaos-system"
	// Kernel is the kernel every simulated node runs.
	Kernel = "6.1.0-56-cloud-amd64"
)

// Options configure a run.
type Options struct {
	// Manager is the operator binary (go build ./cmd/manager; ./test/chaos/kmm-manager-seeded for
	// seeded bugs).
	Manager string
	// Nodes and Modules: N simulated nodes, M Modules selecting all of them.
	Nodes, Modules int
	// APIServers is the number of kube-apiserver instances: 2 or more run behind a balancer, and an
	// apiserver-restart is a rolling restart of one while the others serve (TestChaos: 3); 0 or 1
	// is envtest's single kube-apiserver, restarted in place (everything stalls meanwhile).
	APIServers int
	// Seed draws every fault point and proxy fault.
	Seed uint64
	// Duration is how long faults are injected (rounds of load, upgrade and deletion go on meanwhile).
	Duration time.Duration
	// Minimums are the faults of each kind a run must reach: the fault phase goes on past Duration
	// until every kind has its count (or FaultWall).
	Minimums map[string]int
	// FaultWall bounds the fault phase in wall time, pauses included (default 4 × Duration): a
	// caller's own deadline must leave room for it, the set-up and ConvergeTimeout (MaxRunTime).
	FaultWall time.Duration
	// ConvergeTimeout bounds the convergence after the last fault (default 90 s).
	ConvergeTimeout time.Duration
	// Faults are the kinds injected (default: all of FaultKinds).
	Faults []string
	// Intervals are the mean waits between two faults of a kind (defaults in defaultIntervals);
	// the request faults (429, 500, 409, delay) are shares instead, in Proxy.
	Intervals map[string]time.Duration
	// Proxy are the request fault shares while faults are injected.
	Proxy ProxyFaults
	// PhaseWindow, when positive, is the longest a phase of a round is faulted: past it the faults
	// pause until the phase converged (gate.go). Duration then counts the time faults are on.
	PhaseWindow time.Duration
	// SteadyLeaderShare is the share of the fault time given to MixSteadyLeader (gate.go): an upgrade's
	// window is faulted with it while it has had less than this share. 0: every window is MixAll.
	// Needs PhaseWindow.
	SteadyLeaderShare float64
	// Lease timing of the replicas (defaults 2 s, 1 s, 200 ms: short, so that a partition ends in
	// about two seconds, with a second between the leader's giving up and the next one's taking
	// over, as controller-runtime's defaults of 15 s, 10 s and 2 s keep several).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StopDelay is how long the simulated kubelet keeps a deleted device plugin (or workload) pod
	// running before it confirms the deletion (agent.Options.StopDelay; default 0: at once).
	StopDelay time.Duration
	// Replicas is the number of manager replicas (default 2): a, b, c, ...
	Replicas int
	// LeaderKills is the share of manager kills aimed at the Lease holder (default 1/3); the others
	// kill the replica that does not lead.
	LeaderKills float64
	// Bugs are seeded bugs planted in every replica (KMM_CHAOS_BUGS; needs Manager built from
	// test/chaos/kmm-manager-seeded).
	Bugs []string
	// Baseline runs one fault-free round first, for the writes per pair.
	Baseline bool
	// StopOnViolation ends the fault phase at the first violation (the seeded-bug tests).
	StopOnViolation bool
	// Aims are faults aimed at moments of the scenario (aim.go), for the seeded-bug tests; they
	// come on top of the random ones of Faults (an empty, non-nil Faults for none).
	Aims []Aim
	// AimSettle, when positive, ends the fault phase once every aim has fired and nothing aimed has
	// happened for this long (aimer.settledFor): a bug caught as a stall is then reported after
	// AimSettle plus ConvergeTimeout instead of at the end of Duration.
	AimSettle time.Duration
	// OutDir receives the logs (default: a temporary directory, removed).
	OutDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// setUpBound bounds what a run does besides its fault phase and its convergence: the control
// plane's start, the replicas' first Lease, the fault-free round (each bounded on its own) and the
// teardown.
const setUpBound = 6 * time.Minute

// MaxRunTime is the longest Run takes with o (after its defaults): a caller's deadline shorter than
// this can cut a run that would have passed (issue 34: a 12-minute test deadline expired mid-round
// while the injector's own bound was 28 minutes).
func MaxRunTime(o Options) time.Duration {
	setDefaults(&o)
	return setUpBound + o.FaultWall + 2*o.ConvergeTimeout
}

// defaultIntervals are the mean waits between faults of each kind.
// The partition, kube-apiserver and etcd loops wait their interval after the previous fault ended
// (a partition lasts until the Lease moved; a restart until the process is ready again).
var defaultIntervals = map[string]time.Duration{
	FaultKill: 2 * time.Second, FaultPartition: time.Second, FaultAPIServerRestart: time.Second,
	FaultEtcdRestart: 1200 * time.Millisecond, FaultWatchCut: 500 * time.Millisecond,
}

// harness is a running environment.
type harness struct {
	o        Options
	env      *envtest.Env
	cfg      *rest.Config
	k8s      client.Client
	agent    *agent.Agent
	leases   *leaseBook
	counts   *faultCounts
	watch    *watcher
	replicas []*replica
	plane    map[string]*restartable
	apis     *apiservers
	etcds    *etcdCluster // with apis
	planeMu  sync.Mutex   // one restart of a plane process at a time; guards downtime
	restarts sync.WaitGroup
	nodes    []string
	rng      *rand.Rand
	rngMu    sync.Mutex
	log      io.Writer
	faultsAt struct {
		sync.Mutex
		last time.Time
	}
	downtime map[string][]time.Duration
	curPhase string
	// phasesDone counts the phases completed under faults.
	phasesDone map[string]int
	aims       *aimer // nil without Options.Aims
	// gate turns the faults on and off (PhaseWindow); proxyFaults are the shares while on.
	gate        *faultGate
	proxyFaults ProxyFaults
	// phasesPaused counts the phases under faults that converged only after the faults paused.
	phasesPaused map[string]int
}

func (h *harness) sayf(format string, args ...any) {
	_, _ = fmt.Fprintf(h.log, time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}

// Run sets the environment up, runs the rounds under faults, and tears it all down.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Manager == "" || o.Nodes <= 0 || o.Modules <= 0 {
		return nil, errors.New("chaos: Manager, Nodes and Modules must be set")
	}
	setDefaults(&o)
	if o.OutDir == "" {
		dir, err := os.MkdirTemp("", "kmm-chaos-")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		o.OutDir = dir
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &harness{o: o, leases: newLeaseBook(), counts: newFaultCounts(), log: o.Log, plane: map[string]*restartable{},
		rng:      rand.New(rand.NewPCG(o.Seed, 1)), //nolint:gosec // G404: seeded on purpose, for reproducible fault points
		downtime: map[string][]time.Duration{}, phasesDone: map[string]int{}, phasesPaused: map[string]int{}, gate: newFaultGate()}
	h.watch = newWatcher(h.leases)
	if len(o.Aims) > 0 {
		h.aims = newAimer(h, o.Aims)
	}
	cleanup, err := h.setUp(ctx)
	defer cleanup()
	if err != nil {
		return nil, err
	}
	return h.run(ctx)
}

func setDefaults(o *Options) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.ConvergeTimeout == 0 {
		o.ConvergeTimeout = 90 * time.Second
	}
	if o.FaultWall == 0 {
		o.FaultWall = 4 * o.Duration
	}
	o.APIServers = max(o.APIServers, 1)
	if o.Replicas == 0 {
		o.Replicas = 2
	}
	if o.LeaderKills == 0 {
		o.LeaderKills = 1.0 / 3
	}
	if o.Faults == nil {
		o.Faults = FaultKinds
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 2*time.Second, time.Second, 200*time.Millisecond
	}
	iv := map[string]time.Duration{}
	for k, v := range defaultIntervals {
		iv[k] = v
	}
	for k, v := range o.Intervals {
		iv[k] = v
	}
	o.Intervals = iv
}

// startHAPlane starts a 3-member etcd and h.o.APIServers kube-apiservers behind a balancer in
// place of envtest's, and installs the CRDs into the new etcd; undo gets what stops them.
func (h *harness) startHAPlane(ctx context.Context, env *envtest.Env, etcd, orig *restartable, root string, undo *[]func()) error {
	var err error
	h.sayf("starting a 3-member etcd and %d kube-apiserver instances behind a balancer on %s", h.o.APIServers, env.Config.Host)
	h.etcds, err = startEtcdCluster(ctx, etcd, 3, h.o.OutDir)
	*undo = append(*undo, h.etcds.stop)
	if err != nil {
		return err
	}
	h.apis, err = startAPIServers(ctx, orig, h.o.APIServers, strings.Join(h.etcds.urls, ","), h.o.OutDir, env.Config)
	*undo = append(*undo, h.apis.stop)
	if err != nil {
		return err
	}
	// The new etcd holds none of what envtest installed.
	_, err = crdenvtest.InstallCRDs(env.Config, crdenvtest.CRDInstallOptions{Paths: []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfPathMissing: true})
	return err
}

// createNamespaces creates the operator's and the Lease's namespaces.
func (h *harness) createNamespaces(ctx context.Context) error {
	for _, ns := range []string{Namespace, LeaseNamespace} {
		if err := h.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	return nil
}

// setUp starts the control plane, the kube controllers, the agent and its nodes, the watcher, the
// proxies and the replicas.
func (h *harness) setUp(ctx context.Context) (func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	h.sayf("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler")
	root, err := envtest.RepoRoot()
	if err != nil {
		return cleanup, err
	}
	env, err := envtest.StartWith(envtest.Options{NoWebhook: true})
	if err != nil {
		return cleanup, err
	}
	h.env, h.cfg = env, env.Config
	undo = append(undo, func() { _ = env.Stop() })
	etcd, orig, err := h.envProcesses(env)
	if err != nil {
		return cleanup, err
	}
	h.plane["etcd"] = etcd
	undo = append(undo, etcd.stop, orig.stop)
	if h.o.APIServers == 1 {
		h.plane["kube-apiserver"] = orig
	} else if err := h.startHAPlane(ctx, env, etcd, orig, root, &undo); err != nil {
		return cleanup, err
	}
	if err := env.StartKubeControllers(); err != nil {
		return cleanup, err
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	if h.k8s, err = client.New(cfg, client.Options{Scheme: app.NewScheme()}); err != nil {
		return cleanup, err
	}
	if err := h.createNamespaces(ctx); err != nil {
		return cleanup, err
	}
	if err := h.watch.start(ctx, cfg); err != nil {
		return cleanup, err
	}
	if h.agent, err = agent.New(cfg, agent.Options{StopDelay: h.o.StopDelay}); err != nil {
		return cleanup, err
	}
	go func() { _ = h.agent.Start(ctx) }()
	for i := range h.o.Nodes {
		n := fmt.Sprintf("node-%02d", i)
		if err := h.agent.AddNode(ctx, n, Kernel, map[string]string{"kmm-chaos": "true"}); err != nil {
			return cleanup, err
		}
		h.nodes = append(h.nodes, n)
	}
	stop, err := h.startReplicas()
	undo = append(undo, stop)
	return cleanup, err
}

// envProcesses finds env's etcd and kube-apiserver among the test process's children: its
// kube-apiserver serves on the port of its config, and its etcd on the address kube-apiserver is
// given (other runs of the test process have their own).
func (h *harness) envProcesses(env *envtest.Env) (etcd, apiserver *restartable, err error) {
	host, err := url.Parse(env.Config.Host)
	if err != nil {
		return nil, nil, err
	}
	if apiserver, err = findChild("kube-apiserver", "--secure-port="+host.Port(), h.o.OutDir); err != nil {
		return nil, nil, err
	}
	etcd, err = findChild("etcd", "--listen-client-urls="+apiserver.argValue("etcd-servers"), h.o.OutDir)
	return etcd, apiserver, err
}

// startReplicas starts the replicas (Options.Replicas), each behind its proxy.
func (h *harness) startReplicas() (func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	args := []string{"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--disable-webhook",
		"--leader-elect", "--leader-elect-namespace", LeaseNamespace,
		"--leader-elect-lease-duration", h.o.LeaseDuration.String(), "--leader-elect-renew-deadline", h.o.RenewDeadline.String(),
		"--leader-elect-retry-period", h.o.RetryPeriod.String(),
		"--worker-backoff", "500ms", "--worker-backoff-max", "2s", "--log-level", "info"}
	var env []string
	if len(h.o.Bugs) > 0 {
		env = append(env, seededbug.EnvVar+"="+strings.Join(h.o.Bugs, ","))
	}
	for i := range h.o.Replicas {
		name := string(rune('a' + i))
		p, err := newProxy(h.cfg, name, h.o.Seed+uint64(i)+1, h.leases, h.counts, h.watch.write)
		if err != nil {
			return stop, err
		}
		p.aims = h.aims
		stops = append(stops, p.close)
		r, err := newReplica(name, h.o.Manager, h.o.OutDir, p, args, env)
		if err != nil {
			return stop, err
		}
		r.run()
		stops = append(stops, r.stop)
		h.replicas = append(h.replicas, r)
	}
	return stop, nil
}

// pick draws an integer in [0, n).
func (h *harness) pick(n int) int {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	return h.rng.IntN(n)
}

// jitter draws a wait around mean (uniform in [mean/2, 3·mean/2)).
func (h *harness) jitter(mean time.Duration) time.Duration {
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	return mean/2 + time.Duration(h.rng.Int64N(int64(mean)+1))
}

// faulted records that a fault of kind just ended (for the time to converge after the last one).
func (h *harness) faulted(kind string) {
	h.counts.add(kind)
	h.faultsAt.Lock()
	h.faultsAt.last = time.Now()
	h.faultsAt.Unlock()
}

func (h *harness) lastFault() time.Time {
	h.faultsAt.Lock()
	defer h.faultsAt.Unlock()
	return h.faultsAt.last
}
