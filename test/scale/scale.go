// Package scale is the scale harness of SPEC §10: a local control plane (envtest's etcd and
// kube-apiserver), N simulated nodes whose agent (test/agent) completes worker pods as the real
// worker reports them, M Modules without device plugins, and the operator as a separate process.
// Run measures, phase by phase: the load (Module creation to every pair Loaded), a no-op resync
// (the operator restarted: every object reconciled again, nothing to change) and a bump (every
// Module's image changed: unload and load on every node). For each phase it reports the API
// requests by verb and resource (from the API server's apiserver_request_total, minus the
// harness's and the agent's own requests, which the harness counts on its side), the operator's
// writes per pair, its reconciles (controller_runtime_reconcile_total), its CPU seconds and its
// peak RSS. test/scale/kmm-scale runs it; `make bench-scale` builds and runs that.
package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/envtest"
)

// Namespace holds the harness's Modules.
const Namespace = "kmm-scale"

// Kernel is the kernel every simulated node runs.
const Kernel = "6.1.0-56-cloud-amd64"

// Options configure a run.
type Options struct {
	// Nodes and Modules: N simulated nodes, M Modules selecting all of them.
	Nodes, Modules int
	// Manager is the operator binary (go build ./cmd/manager).
	Manager string
	// OperatorArgs are extra flags for the operator (e.g. --kube-api-qps).
	OperatorArgs []string
	// AgentWorkers is how many worker pods the agent ends at once (default 16).
	AgentWorkers int
	// Timeout bounds each phase (default 10 min).
	Timeout time.Duration
	// OutDir receives the operator logs and profiles (default: a temporary directory).
	OutDir string
	// ProfileSeconds, when positive, saves CPU profiles of the operator and of kube-apiserver over
	// the first ProfileSeconds of the load phase to OutDir/cpu-<N>x<M>.pprof and
	// OutDir/apiserver-cpu-<N>x<M>.pprof.
	ProfileSeconds int
	// ProfilePhase is the phase ProfileSeconds profiles: "load" (the default) or "idle" (its
	// window's first ProfileSeconds: the operator while only the busy cluster's traffic arrives).
	ProfilePhase string
	// Phases are the phases to run, in order, from "load", "resync", "bump" and "floor" (empty:
	// these four), and "idle" and "newmodule" (issue 41: after the load, the operator watched with
	// no Module change, then one more Module loaded). The others need the load before them.
	Phases []string
	// FloorConcurrency are the floor's runs, each working on that many nodes at once (issue 41);
	// nil means DefaultFloorConcurrency. The fastest is the floor.
	FloorConcurrency []int
	// PullTimes, when set, has the simulated kubelet run each worker pod for a time drawn from a
	// long-tailed spread (issue 41, item 4); the load then reports its Tail.
	PullTimes *PullTimes
	// Busy, when set, makes the cluster not empty (issue 41, item 3) and runs the idle phase first.
	Busy *Busy
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Result is a run's measurements.
type Result struct {
	Nodes   int      `json:"nodes"`
	Modules int      `json:"modules"`
	Pairs   int      `json:"pairs"`
	Machine Machine  `json:"machine"`
	Args    []string `json:"operatorArgs"`
	Phases  []Phase  `json:"phases"`
	// NMCBytes is the JSON size of one NMC as stored (managedFields included) after the load.
	NMCBytes int `json:"nmcBytes"`
	// Floor compares the load with the floor phase, when both ran.
	Floor *FloorRatio `json:"floor,omitempty"`
}

// FloorRatio is kmm's load over the floor's (issue 41): the same pairs, on the same control plane,
// in the same run.
type FloorRatio struct {
	// Phase is the fastest floor phase, which the ratio uses.
	Phase string `json:"phase"`
	// LoadSeconds is kmm's load until every pair was Loaded; FloorSeconds the floor's, until its
	// last Loaded status write returned. Ratio is LoadSeconds / FloorSeconds.
	LoadSeconds  float64 `json:"loadSeconds"`
	FloorSeconds float64 `json:"floorSeconds"`
	Ratio        float64 `json:"ratio"`
	// SettledRatio compares the times until the last write (worker pods deleted, labels written).
	SettledRatio float64 `json:"settledRatio"`
}

// Phase is what one phase measured.
type Phase struct {
	Name string `json:"name"`
	// Seconds is the time to convergence: every pair Loaded (load, bump), or the operator quiet
	// after its restart (resync).
	Seconds float64 `json:"seconds"`
	// SettledSeconds is when the operator's writes stopped (worker pods deleted, statuses written).
	SettledSeconds float64 `json:"settledSeconds"`
	// Requests are the API server's request counts (all clients) during the phase.
	Requests Requests `json:"requests"`
	// HarnessRequests are the harness's and the agent's requests, counted on their side.
	HarnessRequests Requests `json:"harnessRequests"`
	// OperatorRequests are Requests minus HarnessRequests minus the API server's own
	// bookkeeping (leases, flow control).
	OperatorRequests Requests `json:"operatorRequests"`
	// OperatorWrites counts the operator's writes, Events included; EventWrites the Events alone.
	OperatorWrites int `json:"operatorWrites"`
	EventWrites    int `json:"eventWrites"`
	// WritesPerPair is OperatorWrites / pairs; WritesPerPairNoEvents leaves the Events out.
	WritesPerPair         float64 `json:"writesPerPair"`
	WritesPerPairNoEvents float64 `json:"writesPerPairNoEvents"`
	// WritesPerPairByKind breaks WritesPerPair down by "VERB resource[/subresource]" (Events
	// included as "POST events" and "PATCH events").
	WritesPerPairByKind map[string]float64 `json:"writesPerPairByKind"`
	// BodyBytesPerWrite is the mean request body size by "verb resource" as the API server measured
	// it (apiserver_request_body_size_bytes, all clients) during the phase.
	BodyBytesPerWrite map[string]float64 `json:"bodyBytesPerWrite"`
	// Reconciles are the operator's reconciles by controller during the phase.
	Reconciles map[string]int `json:"reconciles"`
	// Queues are the operator's work queues by controller during the phase: how long items waited
	// to be worked on, and how long the work took.
	Queues map[string]Queue `json:"queues,omitempty"`
	// CPUSeconds is the operator's CPU time (user+system) during the phase; CPUPerReconcileMicros
	// divides it by all reconciles (it includes watch decoding and cache upkeep).
	CPUSeconds            float64 `json:"cpuSeconds"`
	CPUPerReconcileMicros float64 `json:"cpuPerReconcileMicros"`
	// OtherCPUSeconds are the CPU seconds of the processes sharing the machine with the operator
	// during the phase: kube-apiserver, etcd, and the harness with its agent.
	OtherCPUSeconds map[string]float64 `json:"otherCPUSeconds"`
	// PeakRSSMiB is the operator process's VmHWM at the end of the phase.
	PeakRSSMiB float64 `json:"peakRSSMiB"`
	// APIServerCPUMillisPerPair is kube-apiserver's CPU time during the phase per pair.
	APIServerCPUMillisPerPair float64 `json:"apiserverCPUMillisPerPair"`
	// Stages split the load's and the floor's time per pair.
	Stages *Stages `json:"stages,omitempty"`
	// ChurnedPods are the unrelated pods replaced during the phase (Busy).
	ChurnedPods int `json:"churnedPods,omitempty"`
	// Tail is when the last worker pod ended against when the load converged (with PullTimes).
	Tail *Tail `json:"tail,omitempty"`
	// NMCStatusWriteBytes is the mean request body of an NMC update (all clients; in the load, the
	// bump and the floor every NMC update is a status write).
	NMCStatusWriteBytes float64 `json:"nmcStatusWriteBytes"`
}

// harness is a running environment.
type harness struct {
	o            Options
	env          *envtest.Env
	kubeconfig   string
	k8s          client.Client // reads from cache
	api          client.Client // reads from the API server
	cache        cache.Cache
	agent        *agent.Agent
	apiserver    *http.Client
	count        counter
	operatorArgs []string
	nodes        []string
	seen         *transitions
	stagePrefix  string       // the nodes of the floor phase being measured
	replaced     atomic.Int64 // unrelated pods replaced by the churn (Busy)
}

// Run sets up the environment, runs the phases and tears everything down.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Nodes <= 0 || o.Modules <= 0 || o.Manager == "" {
		return nil, errors.New("scale: Nodes, Modules and Manager must be set")
	}
	if o.AgentWorkers == 0 {
		o.AgentWorkers = 16
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Busy != nil {
		b := o.Busy.withDefaults(o.Nodes)
		o.Busy = &b
	}
	if o.FloorConcurrency == nil {
		o.FloorConcurrency = DefaultFloorConcurrency
	}
	if o.OutDir == "" {
		dir, err := os.MkdirTemp("", "kmm-scale-")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		o.OutDir = dir
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h := &harness{o: o, count: counter{mu: &sync.Mutex{}, reqs: Requests{}}}
	cleanup, err := h.setUp(ctx)
	// The watches end before the control plane stops: kube-apiserver otherwise waits for them (a
	// stop of more than a minute seen after the floor phase).
	defer func() { cancel(); cleanup() }()
	if err != nil {
		return nil, err
	}
	res := &Result{Nodes: o.Nodes, Modules: o.Modules, Pairs: o.Nodes * o.Modules, Machine: DescribeMachine()}
	err = h.phases(ctx, res)
	res.Args = h.operatorArgs
	return res, err
}

func (h *harness) sayf(format string, args ...any) {
	_, _ = fmt.Fprintf(h.o.Log, time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}

// setUp starts the control plane, the harness's cache and the agent with its nodes.
func (h *harness) setUp(ctx context.Context) (func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	h.sayf("starting etcd and kube-apiserver")
	env, err := envtest.Start()
	if err != nil {
		return cleanup, err
	}
	h.env = env
	undo = append(undo, func() { _ = env.Stop() })
	if h.kubeconfig, err = env.WriteKubeconfig(h.o.OutDir); err != nil {
		return cleanup, err
	}
	if h.apiserver, err = rest.HTTPClientFor(env.Config); err != nil {
		return cleanup, err
	}
	// The harness's and the agent's clients: unthrottled, and counted.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	// No gzip on their watches (issue 22): kube-apiserver compressed every watch event it sent them
	// (compress/flate under handleWatch, 2.3 % of its CPU in a 1,000 x 1 load with the operator's
	// watches), work that is the harness's, not the operator's, on the same loopback and cores.
	cfg.DisableCompression = true
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { h.count.next = rt; return h.count })
	if err := h.startCache(ctx, cfg); err != nil {
		return cleanup, err
	}
	if err := h.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		return cleanup, err
	}
	// The agent watches kmm's pods only: the unrelated pods of a busy cluster are the harness's.
	ao := agent.Options{Workers: h.o.AgentWorkers,
		PodSelector: labels.SelectorFromSet(labels.Set{contract.LabelManagedBy: contract.ManagedBy})}
	if h.o.PullTimes != nil {
		// Every running pod is looked at again each Interval: at the default 50 ms, 3,000 pods 20
		// times a second on the shared cores; a quarter second bounds how late a pod ends after
		// its pull (the Tail uses the time it ended, not the time drawn).
		ao.RunDelayFor, ao.Interval = h.o.PullTimes.For, 250*time.Millisecond
	}
	if b := h.o.Busy; b != nil {
		ao.RealNodes, ao.LeasePeriod, ao.StatusPeriod = true, b.LeasePeriod, b.StatusPeriod
	}
	if h.agent, err = agent.New(cfg, ao); err != nil {
		return cleanup, err
	}
	go func() { _ = h.agent.Start(ctx) }()
	h.sayf("adding %d simulated nodes", h.o.Nodes)
	for i := range h.o.Nodes {
		n := nodeName(i)
		l := map[string]string{"kmm-scale": "true"}
		if h.o.Busy != nil {
			l = realNodeLabels(i)
		}
		if err := h.agent.AddNode(ctx, n, Kernel, l); err != nil {
			return cleanup, err
		}
		h.nodes = append(h.nodes, n)
	}
	if h.o.Busy != nil {
		if err := h.populate(ctx); err != nil {
			return cleanup, err
		}
		go h.churn(ctx, &h.replaced)
	}
	return cleanup, nil
}

// startCache watches NMCs, Modules and worker pods for the convergence checks.
func (h *harness) startCache(ctx context.Context, cfg *rest.Config) error {
	scheme := app.NewScheme()
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	// No pod informer: every pod event would be sent and decoded once more on the shared cores;
	// workerPods lists them when it needs to.
	for _, obj := range []client.Object{&kmmv1beta1.NodeModulesConfig{}, &kmmv1beta1.Module{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			return err
		}
	}
	h.seen = newTransitions(nodeName(0))
	nmcs, err := c.GetInformer(ctx, &kmmv1beta1.NodeModulesConfig{})
	if err != nil {
		return err
	}
	if _, err := nmcs.AddEventHandler(h.seen.handler()); err != nil {
		return err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return errors.New("the harness's cache did not sync")
	}
	h.cache = c
	if h.api, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	h.k8s, err = client.New(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: c}})
	return err
}

// phases runs load, resync and bump.
func (h *harness) phases(ctx context.Context, res *Result) error {
	h.sayf("starting the operator")
	op, err := h.startOperator(ctx, "1")
	if err != nil {
		return err
	}
	defer func() {
		if op != nil {
			op.stop()
		}
	}()

	var plan floorPlan
	p, err := h.measure(ctx, "load", &op, func(ctx context.Context) error {
		if h.profiles("load") {
			h.profile(ctx, op)
		}
		for i := range h.o.Modules {
			if err := h.k8s.Create(ctx, h.module(i)); err != nil {
				return err
			}
		}
		return h.waitLoaded(ctx, "")
	})
	res.Phases = append(res.Phases, p)
	if err != nil {
		return err
	}
	if res.NMCBytes, err = h.nmcBytes(ctx); err != nil {
		return err
	}
	if plan, err = h.floorPlanFrom(ctx); err != nil {
		return err
	}
	if err := h.steadyState(ctx, res, op); err != nil {
		return err
	}
	if err := h.afterLoad(ctx, res, &op); err != nil {
		return err
	}
	if !h.runs("floor") {
		return nil
	}
	op.stop()
	op = nil
	return h.floorPhases(ctx, res, plan)
}

// afterLoad runs the resync and the bump, as asked.
func (h *harness) afterLoad(ctx context.Context, res *Result, opp **operator) error {
	op := *opp
	defer func() { *opp = op }()
	if !h.runs("resync") {
		return nil
	}
	h.sayf("restarting the operator (no-op resync)")
	op.stop()
	op = nil
	p, err := h.measure(ctx, "resync", &op, func(ctx context.Context) error {
		var err error
		if op, err = h.startOperator(ctx, "2"); err != nil {
			return err
		}
		return h.waitResynced(ctx, op)
	})
	res.Phases = append(res.Phases, p)
	if err != nil || !h.runs("bump") {
		return err
	}

	p, err = h.measure(ctx, "bump", &op, func(ctx context.Context) error {
		for i := range h.o.Modules {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				m := &kmmv1beta1.Module{}
				if err := h.k8s.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: moduleName(i)}, m); err != nil {
					return err
				}
				m.Spec.ModuleLoader.Container.ContainerImage = image(i, "-v2")
				return h.k8s.Update(ctx, m)
			})
			if err != nil {
				return err
			}
		}
		return h.waitLoaded(ctx, "-v2")
	})
	res.Phases = append(res.Phases, p)
	return err
}

// waitResynced waits until the restarted operator reconciled every node's NMC and every Module
// once: settling alone can end the resync before the new process has synced its caches (at
// 2,000 x 3 it did, with 0 reconciles counted), which would prove nothing about its writes.
func (h *harness) waitResynced(ctx context.Context, op *operator) error {
	for {
		r, err := op.reconciles(ctx)
		if err == nil && r["nmc"] >= h.o.Nodes && r["module"] >= h.o.Modules {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the restarted operator did not reconcile every NMC and Module (%v): %w", r, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nmcBytes is the JSON size of the first node's NMC read from the API server; the NMC itself is
// saved, indented, to OutDir/nmc-<N>x<M>.json.
func (h *harness) nmcBytes(ctx context.Context) (int, error) {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := h.api.Get(ctx, client.ObjectKey{Name: h.nodes[0]}, nmc); err != nil {
		return 0, err
	}
	data, err := json.MarshalIndent(nmc, "", "  ")
	if err != nil {
		return 0, err
	}
	path := filepath.Join(h.o.OutDir, fmt.Sprintf("nmc-%dx%d.json", h.o.Nodes, h.o.Modules))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return 0, err
	}
	compact, err := json.Marshal(nmc)
	return len(compact), err
}

// runs says whether the run includes phase: no Phases means load, resync, bump and floor; idle
// and newmodule run only when asked for.
func (h *harness) runs(phase string) bool {
	if len(h.o.Phases) == 0 {
		return !slices.Contains(optInPhases, phase)
	}
	return slices.Contains(h.o.Phases, phase)
}

// optInPhases run only when Options.Phases names them.
var optInPhases = []string{"idle", "newmodule"}

// profiles says whether ProfileSeconds profiles phase.
func (h *harness) profiles(phase string) bool {
	want := h.o.ProfilePhase
	if want == "" {
		want = "load"
	}
	return h.o.ProfileSeconds > 0 && want == phase
}

// profile saves, in the background, CPU profiles of the operator, of kube-apiserver and of the
// harness itself (with its agent).
func (h *harness) profile(ctx context.Context, op *operator) {
	name := fmt.Sprintf("%dx%d.pprof", h.o.Nodes, h.o.Modules)
	go func() {
		if err := op.profile(ctx, h.o.ProfileSeconds, filepath.Join(h.o.OutDir, "cpu-"+name)); err != nil {
			h.sayf("operator CPU profile failed: %v", err)
		}
	}()
	go func() {
		if err := profileSelf(ctx, h.o.ProfileSeconds, filepath.Join(h.o.OutDir, "harness-cpu-"+name)); err != nil {
			h.sayf("harness CPU profile failed: %v", err)
		}
	}()
	go func() {
		path := filepath.Join(h.o.OutDir, "apiserver-cpu-"+name)
		if err := saveProfile(ctx, h.apiserver, strings.TrimSuffix(h.env.Config.Host, "/"), h.o.ProfileSeconds, path); err != nil {
			h.sayf("kube-apiserver CPU profile failed: %v", err)
		}
	}()
}

// nodeName is the i-th of the operator's nodes.
func nodeName(i int) string { return fmt.Sprintf("%s%04d", NodePrefix, i) }

// NodePrefix starts the names of the nodes of the operator's phases.
const NodePrefix = "node-"

func moduleName(i int) string { return fmt.Sprintf("scale-%d", i) }

// image is module i's image; suffix tells the bump's image apart.
func image(i int, suffix string) string {
	return fmt.Sprintf("registry.example.com/kmm-scale/mod%d%s:$KERNEL_FULL_VERSION", i, suffix)
}

// module is the i-th Module: every node, no device plugin, no version.
func (h *harness) module(i int) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: moduleName(i)},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"kmm-scale": "true"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				ContainerImage: image(i, ""),
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: fmt.Sprintf("kmm_scale_%d", i)},
				KernelMappings: []kmmv1beta1.KernelMapping{{Regexp: `^.+$`}},
			}},
		},
	}
}

// loadedPairs counts the pairs Loaded with their spec's config, whose image has suffix.
func (h *harness) loadedPairs(ctx context.Context, suffix string) (int, error) {
	var nmcs kmmv1beta1.NodeModulesConfigList
	if err := h.cache.List(ctx, &nmcs, client.UnsafeDisableDeepCopy); err != nil {
		return 0, err
	}
	n := 0
	for i := range nmcs.Items {
		nmc := &nmcs.Items[i]
		for _, st := range nmc.Status.Modules {
			if st.State != kmmv1beta1.StateLoaded || st.Config == nil || !strings.Contains(st.Config.ContainerImage, suffix+":") {
				continue
			}
			for _, e := range nmc.Spec.Modules {
				if e.Namespace == st.Namespace && e.Name == st.Name && e.Config.ContainerImage == st.Config.ContainerImage {
					n++
				}
			}
		}
	}
	return n, nil
}

// waitLoaded waits until every pair is Loaded with the image of suffix.
func (h *harness) waitLoaded(ctx context.Context, suffix string) error {
	return h.waitLoadedN(ctx, suffix, h.o.Nodes*h.o.Modules)
}

// waitLoadedN waits until want pairs are Loaded with the image of suffix.
func (h *harness) waitLoadedN(ctx context.Context, suffix string, want int) error {
	last := time.Now()
	for {
		n, err := h.loadedPairs(ctx, suffix)
		if err != nil {
			return err
		}
		if n == want {
			return nil
		}
		if time.Since(last) > 5*time.Second {
			h.sayf("%d of %d pairs Loaded", n, want)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d pairs Loaded: %w", n, want, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// workerPods counts the worker pods left (a LIST of their metadata from the API server).
func (h *harness) workerPods(ctx context.Context) (int, error) {
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	err := h.api.List(ctx, pods, client.MatchingLabels{contract.LabelWorker: "true"})
	return len(pods.Items), err
}

// profileSelf saves a CPU profile of this process over seconds to path.
func profileSelf(ctx context.Context, seconds int, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(seconds) * time.Second):
	}
	pprof.StopCPUProfile()
	return f.Close()
}
