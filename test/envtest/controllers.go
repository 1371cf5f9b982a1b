package envtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kmm-project/kmm/test/netport"
)

// KubeControllers are the kube-controller-manager controllers the tests need: DaemonSets for device
// plugins, Deployments and ReplicaSets for workloads, PodDisruptionBudget status, and owner-reference
// garbage collection. There is no node lifecycle controller: the test node agent plays the kubelet,
// heartbeats included.
var KubeControllers = "daemonset-controller,deployment-controller,replicaset-controller,disruption-controller,garbage-collector-controller"

// StartKubeControllers starts kube-controller-manager and kube-scheduler (from the assets
// directory) against the environment's API server; Stop stops them.
func (e *Env) StartKubeControllers() error {
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "kube-controllers", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("creating the controllers' user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kmm-kube-controllers-")
	if err != nil {
		return err
	}
	e.tempDirs = append(e.tempDirs, dir)
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, kubeconfig, 0o600); err != nil {
		return err
	}
	for _, p := range []struct {
		binary string
		args   []string
	}{
		{"kube-controller-manager", []string{"--controllers=" + KubeControllers, "--leader-elect=false", "--concurrent-daemonset-syncs=4"}},
		{"kube-scheduler", []string{"--leader-elect=false"}},
	} {
		if err := e.startProcess(dir, kc, p.binary, p.args); err != nil {
			return err
		}
	}
	return nil
}

// ComponentFlags are the flags kube-controller-manager and kube-scheduler get in every plane: the
// kubeconfig for the API server, authentication and authorization, and HTTPS on 127.0.0.1:port.
func ComponentFlags(kubeconfig string, port int) []string {
	return []string{"--kubeconfig=" + kubeconfig, "--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port)}
}

// startProcess starts one control-plane binary with the common flags and logs into dir.
func (e *Env) startProcess(dir, kubeconfig, binary string, args []string) error {
	port, err := netport.Free("127.0.0.1")
	if err != nil {
		return err
	}
	args = append(args, ComponentFlags(kubeconfig, port)...)
	log, err := os.Create(filepath.Join(dir, binary+".log"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(e.assets, binary), args...) //nolint:gosec // G204: our own binary and flags
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		cancel()
		return fmt.Errorf("starting %s: %w", binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		cancel()
		return fmt.Errorf("%s exited at start (%v): see %s", binary, err, log.Name())
	case <-time.After(time.Second):
	}
	e.stops = append(e.stops, func() error {
		cancel()
		if err := <-exited; err != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: %w", binary, err)
		}
		return log.Close()
	})
	return nil
}

// stopProcesses stops what StartKubeControllers started and removes its files.
func (e *Env) stopProcesses() error {
	var errs []error
	for i := len(e.stops) - 1; i >= 0; i-- {
		errs = append(errs, e.stops[i]())
	}
	for _, d := range e.tempDirs {
		errs = append(errs, os.RemoveAll(d))
	}
	e.stops, e.tempDirs = nil, nil
	return errors.Join(errs...)
}
