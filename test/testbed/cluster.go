// Package testbed is the integration test bed of the reconcilers' tests (controllers/, upgrade/):
// a real kube-apiserver and etcd with kube-controller-manager and kube-scheduler (test/envtest),
// the test agent playing the kubelet of the simulated nodes (test/agent), and the whole operator
// as cmd/manager wires it (cmd/manager/app).
//
// A test package's TestMain starts one Cluster and runs its tests with it; each test starts its
// own operator (StartOperator) and its own Bed: a namespace, nodes and a selector label no other
// test shares. Over the whole run the Cluster checks invariant 3: at most one worker pod per
// (node, module) pair. Tests assert on the API objects and on what the agent's simulated kernels
// loaded, through the helpers here (PairStatus, Bed.WaitLoaded, Eventually, ...).
//
// controllers and upgrade use it from their external test packages: it imports cmd/manager/app,
// which imports both, so an internal test package importing it would close an import cycle.
package testbed

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/envtest"
)

// The kernels of the test nodes: a Bed's Module has a mapping for each (a literal for KernelA, a
// regexp for KernelB); any other kernel has none.
const (
	KernelA = "6.1.0-56-cloud-amd64"
	KernelB = "6.1.0-57-cloud-amd64"
)

// BackOff is the worker back-off of the operators StartOperator starts: short, so that a test sees
// several retries.
var BackOff = fsm.BackOff{Base: time.Second, Max: 4 * time.Second}

// Cluster is the control plane of one test binary, with the test agent running its nodes.
type Cluster struct {
	// Env is the running kube-apiserver and etcd.
	Env *envtest.Env
	// Client reaches the API server as an administrator, with the operator's scheme.
	Client client.Client
	// Agent plays the kubelet of every node a Bed adds.
	Agent *agent.Agent

	cancel context.CancelFunc
	pods   *podWatch
	seq    atomic.Int32
}

// Start starts the control plane, the kube controllers the tests need (envtest.KubeControllers),
// the test agent and the invariant 3 watch. Run runs the tests and stops it all.
func Start() (*Cluster, error) {
	env, err := envtest.StartWith(envtest.Options{KubeControllers: true})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{Env: env, cancel: cancel, pods: &podWatch{live: map[string]map[string]bool{}}}
	if err := c.start(ctx); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	var err error
	if c.Client, err = client.New(c.Env.Config, client.Options{Scheme: app.NewScheme()}); err != nil {
		return err
	}
	if c.Agent, err = agent.New(c.Env.Config, agent.Options{}); err != nil {
		return err
	}
	go func() { _ = c.Agent.Start(ctx) }()
	return c.pods.start(ctx, c)
}

func (c *Cluster) stop() {
	c.cancel()
	_ = c.Env.Stop()
}

// Run runs the tests, fails the run when the invariant 3 watch saw two worker pods for one pair
// (or, when every test ran, saw no worker pod at all: then it is not watching), stops the cluster
// and returns the exit code for os.Exit.
func (c *Cluster) Run(m *testing.M) int {
	defer c.stop()
	code := m.Run()
	if c.pods.count() == 0 && code == 0 && !testing.Short() && flagRun() == "" {
		fmt.Fprintln(os.Stderr, "the invariant 3 watch saw no worker pod: it is not watching")
		return 1
	}
	if v := c.pods.violations(); len(v) > 0 {
		fmt.Fprintln(os.Stderr, "invariant 3 (at most one worker pod per pair) was broken:", strings.Join(v, "; "))
		return 1
	}
	return code
}

// flagRun is the -test.run pattern ("" when all tests run).
func flagRun() string {
	if f := flag.Lookup("test.run"); f != nil {
		return f.Value.String()
	}
	return ""
}

// Operator is one running operator process (a manager with the controllers).
type Operator struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// StartOperator starts the whole operator, with BackOff, and waits for its webhook server; the
// test stops it at its end (or earlier, by Stop).
func (c *Cluster) StartOperator(t *testing.T) *Operator {
	t.Helper()
	return c.StartOperatorWith(t, nil)
}

// StartOperatorWith is StartOperator with options changed by set (nil: none) first.
func (c *Cluster) StartOperatorWith(t *testing.T, set func(*app.Options)) *Operator {
	t.Helper()
	return c.startOperator(t, set, nil)
}

// StartOperatorAs is StartOperator with the operator's rest config changed by configure first,
// for tests that reach the API server as someone else for some requests.
func (c *Cluster) StartOperatorAs(t *testing.T, configure func(*rest.Config)) *Operator {
	t.Helper()
	return c.startOperator(t, nil, configure)
}

// StartOperatorWithConfig is StartOperator with options changed by set and the rest config by
// configure first (either nil: unchanged).
func (c *Cluster) StartOperatorWithConfig(t *testing.T, set func(*app.Options), configure func(*rest.Config)) *Operator {
	t.Helper()
	return c.startOperator(t, set, configure)
}

// startOperator starts the operator with its options changed by set and its rest config by
// configure (either nil: unchanged).
func (c *Cluster) startOperator(t *testing.T, set func(*app.Options), configure func(*rest.Config)) *Operator {
	t.Helper()
	cfg := rest.CopyConfig(c.Env.Config)
	if configure != nil {
		configure(cfg)
	}
	opts := app.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr, opts.AllowRestartInProcess = "0", "0", true
	opts.WebhookHost, opts.WebhookPort, opts.WebhookCertDir = c.Env.WebhookHost, c.Env.WebhookPort, c.Env.WebhookCertDir
	opts.BackOff = BackOff
	if set != nil {
		set(&opts)
	}
	mgr, err := app.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	op := &Operator{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(op.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(op.Stop)
	check := mgr.GetWebhookServer().StartedChecker()
	Eventually(t, 20*time.Second, func() (bool, string) { return check(nil) == nil, "the webhook server to start" })
	return op
}

// Stop stops the operator and waits until it has stopped.
func (o *Operator) Stop() {
	o.cancel()
	<-o.done
}
