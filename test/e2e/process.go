package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one daemon of the cluster (containerd, kubelet, kube-controller-manager,
// kube-scheduler), its output in logs/<name>.log.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *os.File
	exited chan error
}

// startProcess starts binary with args, its output in logDir/name.log. The child gets SIGKILL if
// the test process dies without stopping it (Pdeathsig), and the cleanup command finds whatever
// survives by the test folder named in its command line.
func startProcess(logDir, name, binary string, args ...string) (*process, error) {
	log, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...) //nolint:gosec // G204: our own daemons with flags we build
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: log, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	return p, nil
}

// waitReady polls ready until it returns nil, failing early when the process exits.
func (p *process) waitReady(ctx context.Context, timeout time.Duration, ready func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case werr := <-p.exited:
			p.exited <- werr // stop reads it again
			return fmt.Errorf("%s exited at start (%v): see %s", p.name, werr, p.log.Name())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v (%v): see %s", p.name, timeout, err, p.log.Name())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILL. It reports an exit other than by the
// signals it sent.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	defer func() { _ = p.log.Close() }()
	select {
	case err := <-p.exited:
		return fmt.Errorf("%s had exited before the teardown (%v): see %s", p.name, err, p.log.Name())
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case werr := <-p.exited:
		_ = werr // "signal: terminated": ours
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	err := <-p.exited
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil // killed by us
	}
	return err
}
