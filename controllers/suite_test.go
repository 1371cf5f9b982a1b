package controllers_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/poll"
)

const (
	kernelA = "6.1.0-56-cloud-amd64"
	kernelB = "6.1.0-57-cloud-amd64"
)

var (
	env    *envtest.Env
	k8s    client.Client
	node   *agent.Agent
	pairs  = &podWatch{live: map[string]map[string]bool{}}
	nsSeq  atomic.Int32
	testBO = fsm.BackOff{Base: time.Second, Max: 4 * time.Second}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if env, err = envtest.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	if err := env.StartKubeControllers(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if k8s, err = client.New(env.Config, client.Options{Scheme: app.NewScheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if node, err = agent.New(env.Config, agent.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() { _ = node.Start(ctx) }()
	if err := pairs.start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if pairs.count() == 0 && code == 0 && !testing.Short() && flagRun() == "" {
		fmt.Fprintln(os.Stderr, "the invariant 3 watch saw no worker pod: it is not watching")
		return 1
	}
	if v := pairs.violations(); len(v) > 0 {
		fmt.Fprintln(os.Stderr, "invariant 3 (at most one worker pod per pair) was broken:", strings.Join(v, "; "))
		return 1
	}
	return code
}

// podWatch checks invariant 3 over the whole suite: it watches every worker pod and records a
// violation whenever two exist for one (node, module) pair.
type podWatch struct {
	mu    sync.Mutex
	live  map[string]map[string]bool // pair → pod UIDs
	viols []string
	seen  int
}

func (w *podWatch) start(ctx context.Context) error {
	return watchEach(ctx, &corev1.PodList{}, w.observe, client.MatchingLabels{contract.LabelWorker: "true"})
}

// watchEach watches the objects of list until ctx ends and hands each event's object, in order,
// to observe on a goroutine of its own.
func watchEach[T client.Object](ctx context.Context, list client.ObjectList, observe func(watch.EventType, T), opts ...client.ListOption) error {
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: app.NewScheme()})
	if err != nil {
		return err
	}
	w, err := wc.Watch(ctx, list, opts...)
	if err != nil {
		return err
	}
	go func() {
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(T); ok {
				observe(ev.Type, o)
			}
		}
	}()
	return nil
}

// watchForTest is watchEach for the rest of the test.
func watchForTest[T client.Object](t *testing.T, list client.ObjectList, observe func(watch.EventType, T), opts ...client.ListOption) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := watchEach(ctx, list, observe, opts...); err != nil {
		t.Fatal(err)
	}
}

func (w *podWatch) observe(t watch.EventType, p *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pair := p.Spec.NodeName + "/" + p.Labels[contract.LabelModuleNamespace] + "/" + p.Labels[contract.LabelModuleName]
	if w.live[pair] == nil {
		w.live[pair] = map[string]bool{}
	}
	if t == watch.Deleted {
		delete(w.live[pair], string(p.UID))
		return
	}
	w.live[pair][string(p.UID)] = true
	w.seen++
	if len(w.live[pair]) > 1 {
		w.viols = append(w.viols, fmt.Sprintf("%d worker pods for %s", len(w.live[pair]), pair))
	}
}

func (w *podWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// flagRun is the -test.run pattern ("" when all tests run).
func flagRun() string {
	if f := flag.Lookup("test.run"); f != nil {
		return f.Value.String()
	}
	return ""
}

func (w *podWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.viols...)
}

// operator is one running operator process (a manager with the controllers).
type operator struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startOperator starts the controllers; the test stops them at its end (or earlier, by stop).
func startOperator(t *testing.T) *operator {
	t.Helper()
	opts := app.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr, opts.AllowRestartInProcess = "0", "0", true
	opts.WebhookHost, opts.WebhookPort, opts.WebhookCertDir = env.WebhookHost, env.WebhookPort, env.WebhookCertDir
	opts.BackOff = testBO
	mgr, err := app.New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	op := &operator{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(op.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(op.stop)
	check := mgr.GetWebhookServer().StartedChecker()
	eventually(t, 20*time.Second, func() (bool, string) { return check(nil) == nil, "the webhook server to start" })
	return op
}

func (o *operator) stop() {
	o.cancel()
	<-o.done
}

// testBed is one test's namespace, nodes and selector label.
type testBed struct {
	t     *testing.T
	ns    string
	label string
	nodes []string
}

// newTestBed creates a namespace and n nodes running kernel, selected by a label unique to the test.
func newTestBed(t *testing.T, n int, kernel string) *testBed {
	t.Helper()
	id := nsSeq.Add(1)
	tb := &testBed{t: t, ns: fmt.Sprintf("ctl-%d", id), label: fmt.Sprintf("kmm-test-%d", id)}
	if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tb.ns}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		tb.addNode(fmt.Sprintf("t%d-n%d", id, i), kernel)
	}
	return tb
}

func (tb *testBed) addNode(name, kernel string) {
	tb.t.Helper()
	if err := node.AddNode(context.Background(), name, kernel, map[string]string{tb.label: "yes"}); err != nil {
		tb.t.Fatal(err)
	}
	tb.nodes = append(tb.nodes, name)
}

// module returns a Module selecting the test's nodes: kernel A and B have mappings, others do not.
func (tb *testBed) module(name string) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: tb.ns, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{tb.label: "yes"},
			ModuleLoader: kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: name},
				KernelMappings: []kmmv1beta1.KernelMapping{
					{Literal: kernelA, ContainerImage: "reg.example.com/" + name + ":a"},
					{Regexp: `^6\.1\.0-57-`, ContainerImage: "reg.example.com/" + name + ":b-$KERNEL_XYZ"},
				},
			}},
		},
	}
}

// versionedModule is module(name) at version, its first mapping's image tagged with the version.
func (tb *testBed) versionedModule(name, version string) *kmmv1beta1.Module {
	m := tb.module(name)
	m.Spec.ModuleLoader.Container.Version = version
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/" + name + ":" + version
	return m
}

func (tb *testBed) create(obj client.Object) {
	tb.t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		tb.t.Fatal(err)
	}
}

// pairStatus returns the NMC status entry of a module on a node (nil when none).
func pairStatus(nodeName, ns, name string) *kmmv1beta1.NodeModuleStatus {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: nodeName}, nmc); err != nil {
		return nil
	}
	for i := range nmc.Status.Modules {
		if st := &nmc.Status.Modules[i]; st.Namespace == ns && st.Name == name {
			return st
		}
	}
	return nil
}

// eventually polls cond until it holds or the timeout passes; cond says what it is waiting for.
func eventually(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	poll.Until(t, timeout, 100*time.Millisecond, cond)
}

// waitLoaded waits until the module is Loaded with image on every node given.
func (tb *testBed) waitLoaded(name, image string, nodes ...string) {
	tb.t.Helper()
	eventually(tb.t, 30*time.Second, func() (bool, string) {
		for _, n := range nodes {
			st := pairStatus(n, tb.ns, name)
			if st == nil || st.State != kmmv1beta1.StateLoaded || st.Config == nil || st.Config.ContainerImage != image {
				return false, fmt.Sprintf("%s on %s: %+v, want Loaded with %s", name, n, describe(st), image)
			}
			if got, ok := node.Loaded(n)[tb.ns+"/"+name]; !ok || got.ContainerImage != image {
				return false, fmt.Sprintf("the kernel of %s does not have %s loaded (%v)", n, image, got.ContainerImage)
			}
		}
		return true, ""
	})
}

func describe(st *kmmv1beta1.NodeModuleStatus) string {
	if st == nil {
		return "no status entry"
	}
	img := ""
	if st.Config != nil {
		img = st.Config.ContainerImage
	}
	return fmt.Sprintf("%s (%s: %s) image %q attempts %d", st.State, st.Reason, st.Message, img, st.Attempts)
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func workerPodsOn(t *testing.T, nodeName string) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.MatchingLabels{contract.LabelWorker: "true", contract.LabelNode: nodeName}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// bumpVersion moves a Module to version with the first mapping's image, in one update (seed 002).
func bumpVersion(t *testing.T, m *kmmv1beta1.Module, version, image string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			return err
		}
		got.Spec.ModuleLoader.Container.Version = version
		got.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = image
		return k8s.Update(context.Background(), got)
	})
	if err != nil {
		t.Fatal(err)
	}
}
