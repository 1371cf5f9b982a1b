// Package demo is kmm end to end on a local control plane: etcd, kube-apiserver, kube-controller-
// manager and kube-scheduler built by the project; an in-process OCI registry holding generated kmod
// images; simulated nodes whose agent runs every worker pod through the real worker binary in
// dry-run mode against a per-node sandbox (real modprobe and depmod; only the node's list of loaded
// modules is simulated); and the operator. Run walks through loading, a reboot, a kernel upgrade, an
// ordered upgrade v1→v2 and the Module's deletion, printing `kubectl kmm status` at each step.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/kmodimage"
)

// The kernels the simulated nodes run; both have kmod images.
const (
	KernelA = "6.1.0-56-cloud-amd64"
	KernelB = "6.1.0-57-cloud-amd64"
)

// Options configure a run.
type Options struct {
	// WorkerBinary is the kmm worker, run for every worker pod.
	WorkerBinary string
	// KubectlKMM is the kubectl-kmm plugin binary, used for the state tables.
	KubectlKMM string
	// Nodes is how many simulated nodes to run (default 3).
	Nodes int
	// Out receives the walk-through.
	Out io.Writer
	// StepTimeout bounds every wait (default 60 s).
	StepTimeout time.Duration
}

// Summary is what a run proved, one line per step.
type Summary struct {
	Steps []Step
}

// Step is one proven step of the walk-through.
type Step struct {
	Name     string
	Duration time.Duration
	Detail   string
}

// demo is a running demo environment.
type demo struct {
	o          Options
	env        *envtest.Env
	k8s        client.Client
	agent      *agent.Agent
	registry   string
	sandboxes  string
	kubeconfig string
	nodes      []string
	summary    Summary
}

// Run sets the environment up, walks through the scenario and tears everything down (also when ctx
// is cancelled). It returns an error saying which step failed and why.
func Run(ctx context.Context, o Options) (Summary, error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 60 * time.Second
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	d := &demo{o: o}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cleanup, err := d.setUp(ctx)
	defer cleanup()
	if err != nil {
		return d.summary, err
	}
	return d.summary, d.walkThrough(ctx)
}

// setUp starts everything; the returned cleanup undoes whatever was started.
func (d *demo) setUp(ctx context.Context) (func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	d.sayf("Starting the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)")
	env, err := envtest.StartWith(envtest.Options{KubeControllers: true})
	if err != nil {
		return cleanup, err
	}
	d.env = env
	undo = append(undo, func() { _ = env.Stop() })
	dir, err := os.MkdirTemp("", "kmm-demo-")
	if err != nil {
		return cleanup, err
	}
	undo = append(undo, func() { _ = os.RemoveAll(dir) })
	d.sandboxes = filepath.Join(dir, "nodes")
	if d.kubeconfig, err = env.WriteKubeconfig(dir); err != nil {
		return cleanup, err
	}
	reg := httptest.NewServer(registry.New(registry.Logger(nopLogger())))
	undo = append(undo, reg.Close)
	d.registry = strings.TrimPrefix(reg.URL, "http://")
	if err := d.pushImages(); err != nil {
		return cleanup, err
	}
	if err := d.startOperator(ctx); err != nil {
		return cleanup, err
	}
	return cleanup, d.startNodes(ctx)
}

// pushImages builds the kmod images (v1 and v2, for both kernels) and pushes them to the registry.
func (d *demo) pushImages() error {
	tools, err := kmodimage.FindTools()
	if err != nil {
		return err
	}
	for _, version := range []string{"v1", "v2"} {
		for _, kernel := range []string{KernelA, KernelB} {
			img, err := kmodimage.Build(tools, kmodimage.Spec{Kernel: kernel, Module: "kmm_demo", Version: version})
			if err != nil {
				return fmt.Errorf("building the %s image for %s: %w", version, kernel, err)
			}
			ref, err := name.ParseReference(d.image(version, kernel), name.Insecure)
			if err != nil {
				return err
			}
			if err := remote.Write(ref, img); err != nil {
				return fmt.Errorf("pushing %s: %w", ref, err)
			}
		}
	}
	d.sayf("Pushed 4 kmod images (FROM scratch, real ELF .ko files and depmod output) to the registry at %s", d.registry)
	return nil
}

// image is the reference of the kmod image of version for kernel.
func (d *demo) image(version, kernel string) string {
	return fmt.Sprintf("%s/kmm-demo/kmm-demo-%s:%s", d.registry, version, kernel)
}

func (d *demo) startOperator(ctx context.Context) error {
	opts := app.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr = "0", "0"
	opts.WebhookHost, opts.WebhookPort, opts.WebhookCertDir = d.env.WebhookHost, d.env.WebhookPort, d.env.WebhookCertDir
	opts.AllowRestartInProcess = true
	mgr, err := app.New(d.env.Config, opts)
	if err != nil {
		return err
	}
	d.k8s = mgr.GetClient()
	exited := make(chan error, 1)
	go func() { exited <- mgr.Start(ctx) }()
	check := mgr.GetWebhookServer().StartedChecker()
	ended, startErr := false, error(nil)
	err = d.waitFor(ctx, "the operator's webhook to serve", func() (bool, string) {
		select {
		case startErr = <-exited:
			ended = true
			return true, ""
		default:
			err := check(nil)
			return err == nil, fmt.Sprint(err)
		}
	})
	if err == nil && ended { // the manager ended before its webhook served: say why
		err = fmt.Errorf("the operator ended before its webhook served: %v", startErr)
	}
	return err
}

func (d *demo) sayf(format string, args ...any) {
	_, _ = fmt.Fprintf(d.o.Out, "==> "+format+"\n", args...)
}

// waitFor polls cond until it holds, the step times out, or ctx ends.
func (d *demo) waitFor(ctx context.Context, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(d.o.StepTimeout)
	for {
		ok, detail := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s: %s", d.o.StepTimeout, what, detail)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), fmt.Errorf("interrupted while waiting for %s", what))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
