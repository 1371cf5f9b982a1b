package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/node"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
)

// FloorNodePrefix starts the names of the floor's nodes (floor16-0000, ... for a floor working on
// 16 nodes at once), apart from the operator's.
const FloorNodePrefix = "floor"

// DefaultFloorConcurrency are the floor runs of a harness run: how many nodes each works on at
// once.
var DefaultFloorConcurrency = []int{16, 64}

// floorPlan is what the floor replays on each of its nodes: the happy path of kmm's load, with the
// objects kmm wrote on its first node (spec entries, Loaded status, node labels) and the worker
// pods kmm builds.
type floorPlan struct {
	entries []kmmv1beta1.NodeModuleSpec
	loading []kmmv1beta1.NodeModuleStatus // as the harness first saw them Loading
	loaded  []kmmv1beta1.NodeModuleStatus
	labels  map[string]string // the labels kmm added to its first node
	worker  node.WorkerPodOptions
}

// floor is a client with no logic making kmm's happy-path requests (SPEC §10, issue 41): for each
// node, one NMC apply per Module (each with that Module's field manager), a status write with every
// pair Loading, the worker pods, then — once the simulated kubelet has ended them — a status write
// with every pair Loaded, the node's ready labels and the pods' deletion. Every node starts at
// once; at most a concurrency of them make requests at a time (a node waiting for the kubelet
// makes none): nothing waits but on the API server and the kubelet.
type floor struct {
	plan floorPlan
	// concurrency is how many nodes make requests at once; prefix starts its nodes' names.
	concurrency int
	prefix      string
	c           client.Client
	cache       cache.Cache
	mu          sync.Mutex
	done        map[string]chan struct{} // worker pod name → closed when the pod has ended
	// loadedAt is when the last Loaded status write returned.
	loadedAt time.Time
}

// floorPlanFrom reads the plan from the operator's first node after its load.
func (h *harness) floorPlanFrom(ctx context.Context) (floorPlan, error) {
	var p floorPlan
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := h.api.Get(ctx, client.ObjectKey{Name: h.nodes[0]}, nmc); err != nil {
		return p, err
	}
	p.entries, p.loaded = nmc.Spec.Modules, nmc.Status.Modules
	if len(p.entries) != h.o.Modules || len(p.loaded) != h.o.Modules {
		return p, fmt.Errorf("node %s has %d spec and %d status entries, want %d", h.nodes[0], len(p.entries), len(p.loaded), h.o.Modules)
	}
	for _, st := range p.loaded {
		loading, ok := h.seen.entry(h.nodes[0], st.Namespace+"/"+st.Name, kmmv1beta1.StateLoading)
		if !ok {
			return p, fmt.Errorf("the harness never saw %s/%s Loading on %s", st.Namespace, st.Name, h.nodes[0])
		}
		p.loading = append(p.loading, loading)
	}
	n := &corev1.Node{}
	if err := h.api.Get(ctx, client.ObjectKey{Name: h.nodes[0]}, n); err != nil {
		return p, err
	}
	p.labels = map[string]string{}
	for k, v := range n.Labels {
		if k != corev1.LabelHostname && k != corev1.LabelOSStable && k != "kmm-scale" {
			p.labels[k] = v
		}
	}
	args, err := app.ParseArgs(h.o.OperatorArgs)
	if err != nil {
		return p, err
	}
	// As cmd/manager/app builds them from the operator's flags.
	p.worker = node.WorkerPodOptions{Image: args.WorkerImage, DryRunSandbox: args.WorkerDryRunSandbox,
		FirmwareHostPath: args.FirmwareHostPath, LeaveFirmwareClassPath: !args.SetFirmwareClassPath, Registry: args.WorkerRegistry}
	return p, nil
}

// startFloor adds the floor's nodes and starts its client and its cache of worker pods. Its
// client is not counted with the harness's: in the floor phase it plays the operator.
func (h *harness) startFloor(ctx context.Context, plan floorPlan, concurrency int) (*floor, []*corev1.Node, error) {
	prefix := fmt.Sprintf("%s%d-", FloorNodePrefix, concurrency)
	h.sayf("adding %d floor nodes %s*", h.o.Nodes, prefix)
	nodes := make([]*corev1.Node, 0, h.o.Nodes)
	for i := range h.o.Nodes {
		name := fmt.Sprintf("%s%04d", prefix, i)
		if err := h.agent.AddNode(ctx, name, Kernel, map[string]string{"kmm-scale": "true"}); err != nil {
			return nil, nil, err
		}
		n := &corev1.Node{}
		if err := h.api.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return nil, nil, err
		}
		nodes = append(nodes, n)
	}
	cfg := rest.CopyConfig(h.env.Config)
	cfg.QPS, cfg.Burst, cfg.DisableCompression = -1, 0, true
	// A connection of its own, as the operator has: client-go would otherwise share the harness's
	// and the agent's (one transport per TLS configuration), and the floor's requests, every node
	// at once, would queue the simulated kubelet's behind them.
	cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	f := &floor{plan: plan, concurrency: concurrency, prefix: prefix, done: map[string]chan struct{}{}}
	scheme := app.NewScheme()
	var err error
	if f.c, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, nil, err
	}
	// Like the operator, the floor learns that a pod ended from a watch of its worker pods.
	f.cache, err = cache.New(cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: labels.SelectorFromSet(labels.Set{contract.LabelWorker: "true"})},
	}})
	if err != nil {
		return nil, nil, err
	}
	inf, err := f.cache.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, nil, err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    f.podSeen,
		UpdateFunc: func(_, obj any) { f.podSeen(obj) },
	}); err != nil {
		return nil, nil, err
	}
	go func() { _ = f.cache.Start(ctx) }()
	if !f.cache.WaitForCacheSync(ctx) {
		return nil, nil, errors.New("the floor's cache did not sync")
	}
	return f, nodes, nil
}

// podSeen closes the wait of a worker pod that has ended.
func (f *floor) podSeen(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || (pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.done[pod.Name]; ok {
		close(ch)
		delete(f.done, pod.Name)
	}
}

// waitFor registers the wait for a worker pod's end (before the pod is created, so that no event is missed).
func (f *floor) waitFor(name string) chan struct{} {
	ch := make(chan struct{})
	f.mu.Lock()
	f.done[name] = ch
	f.mu.Unlock()
	return ch
}

// floorPhases run the floor once per concurrency, each on nodes of its own, the operator stopped,
// and compare the fastest with the load.
func (h *harness) floorPhases(ctx context.Context, res *Result, plan floorPlan) error {
	var best *Phase
	for _, c := range h.o.FloorConcurrency {
		p, err := h.floorPhase(ctx, plan, c)
		res.Phases = append(res.Phases, p)
		if err != nil {
			return err
		}
		if best == nil || p.Seconds < best.Seconds {
			best = &res.Phases[len(res.Phases)-1]
		}
	}
	for _, load := range res.Phases {
		if load.Name == "load" && best != nil && best.Seconds > 0 && best.SettledSeconds > 0 {
			res.Floor = &FloorRatio{Phase: best.Name, LoadSeconds: load.Seconds, FloorSeconds: best.Seconds, Ratio: load.Seconds / best.Seconds,
				SettledRatio: load.SettledSeconds / best.SettledSeconds}
			h.sayf("floor: kmm's load %.1f s / the fastest floor's (%s) %.1f s = %.2fx (until the last write: %.2fx)",
				load.Seconds, best.Name, best.Seconds, res.Floor.Ratio, res.Floor.SettledRatio)
		}
	}
	return nil
}

// floorPhase runs the floor working on concurrency nodes at once.
func (h *harness) floorPhase(ctx context.Context, plan floorPlan, concurrency int) (Phase, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f, nodes, err := h.startFloor(fctx, plan, concurrency)
	if err != nil {
		return Phase{Name: "floor"}, err
	}
	h.stagePrefix = f.prefix
	var none *operator
	var start time.Time
	p, err := h.measure(ctx, fmt.Sprintf("floor%d", concurrency), &none, func(ctx context.Context) error {
		start = time.Now()
		return f.run(ctx, nodes)
	})
	if !f.loadedAt.IsZero() {
		p.Seconds = f.loadedAt.Sub(start).Seconds()
	}
	return p, err
}

// run replays the plan on the nodes and returns when every node is done. At most f.concurrency
// nodes make requests at once; a node waiting for the kubelet to end its pods holds no slot, as an
// operator's worker does not wait for a pod either.
func (f *floor) run(ctx context.Context, nodes []*corev1.Node) error {
	errs := make(chan error, len(nodes))
	slots := make(chan struct{}, max(f.concurrency, 1))
	for _, n := range nodes {
		go func() { errs <- f.node(ctx, n, slots) }()
	}
	var all []error
	for range nodes {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// holding runs do with one of slots taken.
func holding(ctx context.Context, slots chan struct{}, do func() error) error {
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-slots }()
	return do()
}

// node makes one node's requests in kmm's order: the front (applies, Loading, pods), then, once
// the kubelet ended the pods, the back (Loaded, labels, deletions).
func (f *floor) node(ctx context.Context, n *corev1.Node, slots chan struct{}) error {
	var pods []*corev1.Pod
	var waits []chan struct{}
	nmc := &kmmv1beta1.NodeModulesConfig{}
	err := holding(ctx, slots, func() error {
		var err error
		pods, waits, err = f.front(ctx, n, nmc)
		return err
	})
	if err != nil {
		return err
	}
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return holding(ctx, slots, func() error { return f.back(ctx, n, nmc, pods) })
}

// front applies the entries, writes the Loading status into nmc and creates the worker pods.
func (f *floor) front(ctx context.Context, n *corev1.Node, nmc *kmmv1beta1.NodeModulesConfig) ([]*corev1.Pod, []chan struct{}, error) {
	var u *unstructured.Unstructured
	for i := range f.plan.entries {
		var err error
		if u, err = f.apply(ctx, n, &f.plan.entries[i]); err != nil {
			return nil, nil, err
		}
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, nmc); err != nil {
		return nil, nil, err
	}
	// As the operator's cache holds it: without managedFields.
	nmc.ManagedFields = nil
	if err := f.writeStatus(ctx, nmc, f.plan.loading); err != nil {
		return nil, nil, err
	}
	pods := make([]*corev1.Pod, 0, len(f.plan.entries))
	waits := make([]chan struct{}, 0, len(f.plan.entries))
	for i := range f.plan.entries {
		in := &fsm.WorkerIntent{Action: contract.ActionLoad, Attempt: f.plan.loaded[i].Attempts, Entry: f.plan.entries[i]}
		pod, err := node.WorkerPod(n.Name, f.plan.worker, in)
		if err != nil {
			return nil, nil, err
		}
		waits = append(waits, f.waitFor(pod.Name))
		if err := f.c.Create(ctx, pod); err != nil {
			return nil, nil, fmt.Errorf("creating %s: %w", pod.Name, err)
		}
		pods = append(pods, pod)
	}
	return pods, waits, nil
}

// back writes the Loaded status, the node's labels, and deletes the pods.
func (f *floor) back(ctx context.Context, n *corev1.Node, nmc *kmmv1beta1.NodeModulesConfig, pods []*corev1.Pod) error {
	if err := f.writeStatus(ctx, nmc, f.plan.loaded); err != nil {
		return err
	}
	f.mu.Lock()
	f.loadedAt = time.Now()
	f.mu.Unlock()
	if err := f.label(ctx, n); err != nil {
		return err
	}
	for _, pod := range pods {
		if err := f.c.Delete(ctx, pod, client.Preconditions{UID: &pod.UID}); err != nil {
			return fmt.Errorf("deleting %s: %w", pod.Name, err)
		}
	}
	return nil
}

// apply server-side-applies one Module's entry as the Module controller does.
func (f *floor) apply(ctx context.Context, n *corev1.Node, e *kmmv1beta1.NodeModuleSpec) (*unstructured.Unstructured, error) {
	entry, err := runtime.DefaultUnstructuredConverter.ToUnstructured(e)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(),
		"kind":       "NodeModulesConfig",
		"metadata": map[string]any{
			"name":            n.Name,
			"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Node", "name": n.Name, "uid": string(n.UID)}},
		},
		"spec": map[string]any{"modules": []any{entry}},
	}}
	owner := client.FieldOwner(shared.FieldManager(e.Namespace, e.Name))
	if err := f.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), owner, client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("applying %s/%s on %s: %w", e.Namespace, e.Name, n.Name, err)
	}
	return u, nil
}

// writeStatus writes a status of kmm's first node.
func (f *floor) writeStatus(ctx context.Context, nmc *kmmv1beta1.NodeModulesConfig, entries []kmmv1beta1.NodeModuleStatus) error {
	nmc.Status.Modules = make([]kmmv1beta1.NodeModuleStatus, len(entries))
	for i, st := range entries {
		st.LastTransitionTime = metav1.Now()
		nmc.Status.Modules[i] = st
	}
	if err := f.c.Status().Update(ctx, nmc); err != nil {
		return fmt.Errorf("writing the status of %s: %w", nmc.Name, err)
	}
	nmc.ManagedFields = nil
	return nil
}

// label adds the labels kmm added to its first node.
func (f *floor) label(ctx context.Context, n *corev1.Node) error {
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": f.plan.labels}})
	if err != nil {
		return err
	}
	return f.c.Patch(ctx, n, client.RawPatch(types.MergePatchType, data))
}
