package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/netport"
)

// The chaos plane is not test/envtest's starter alone: its faults kill etcd and kube-apiserver and
// start them again with the same command line (same ports, data and certificates), which envtest,
// starting each process once and stopping it only with the whole plane, cannot do; and the highly
// available plane (-chaos.apiservers > 1) is a 3-member etcd and several kube-apiservers behind a
// balancer, which envtest does not start. So the harness starts the plane with envtest.StartWith,
// takes over its two processes (findChild) or replaces them (startEtcdCluster, startAPIServers),
// then starts kube-controller-manager and kube-scheduler with envtest's StartKubeControllers; the
// ports come from test/netport.

// restartable is one control-plane process (etcd or kube-apiserver) the injector kills and starts
// again with the same command line: same ports, same data directory, same certificates.
type restartable struct {
	name string
	pid  int
	args []string
	dir  string
	env  []string  // set on top of the test process's environment
	cmd  *exec.Cmd // nil while the process is envtest's own child
	done chan struct{}
	log  *os.File
}

// findChild finds this process's child named name whose command line has an argument mark
// (envtest starts etcd and kube-apiserver as children of the test process, and parallel runs have
// one of each) and reads its command line and working directory.
func findChild(name, mark, logDir string) (*restartable, error) {
	for _, c := range envtest.Children() {
		if c.Name != name {
			continue
		}
		pid := c.PID
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			return nil, err
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if !slices.Contains(args, mark) {
			continue
		}
		cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if err != nil {
			return nil, err
		}
		log, err := os.Create(filepath.Join(logDir, name+".log"))
		if err != nil {
			return nil, err
		}
		return &restartable{name: name, pid: pid, args: args, dir: cwd, log: log}, nil
	}
	return nil, fmt.Errorf("no child process named %s with the argument %s", name, mark)
}

// kill ends the process with SIGKILL and waits until it is gone.
func (r *restartable) kill() error {
	if err := syscall.Kill(r.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	if r.cmd != nil {
		<-r.done
		return nil
	}
	// envtest's own child: envtest reaps it; wait until the pid is gone.
	for i := 0; i < 500; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/stat", r.pid)); err != nil {
			return nil
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.pid)); err == nil && strings.Contains(string(st), ") Z ") {
			return nil // a zombie, not yet reaped: the ports are free
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s (pid %d) did not exit", r.name, r.pid)
}

// start runs the process again with its command line.
func (r *restartable) start() error {
	cmd := exec.Command(r.args[0], r.args[1:]...) //nolint:gosec // G204: the command line envtest ran
	cmd.Dir, cmd.Stdout, cmd.Stderr = r.dir, r.log, r.log
	cmd.Env = append(os.Environ(), r.env...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s again: %w", r.name, err)
	}
	r.cmd, r.pid, r.done = cmd, cmd.Process.Pid, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(r.done)
	return nil
}

// stop kills a process this package started (envtest stops its own).
func (r *restartable) stop() {
	if r.cmd != nil {
		_ = r.kill()
	}
	_ = r.log.Close()
}

// argValue is the value of --flag=value in the command line ("" when absent).
func (r *restartable) argValue(flag string) string {
	for i, a := range r.args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			return v
		}
		if a == "--"+flag && i+1 < len(r.args) {
			return r.args[i+1]
		}
	}
	return ""
}

// restart kills the process and starts it again, then waits until ready says it serves; it
// returns how long the process was down. A start that exits (its port not free yet) is retried.
func (r *restartable) restart(ctx context.Context, ready func(context.Context) error) (time.Duration, error) {
	return r.restartAfter(ctx, 0, ready)
}

// restartAfter is restart with the process kept down for at least down before it starts again.
func (r *restartable) restartAfter(ctx context.Context, down time.Duration, ready func(context.Context) error) (time.Duration, error) {
	t0 := time.Now()
	if err := r.kill(); err != nil {
		return 0, err
	}
	time.Sleep(down)
	for attempt := 0; attempt < 50; attempt++ {
		if err := r.start(); err != nil {
			return 0, err
		}
		if r.waitReady(ctx, ready) {
			return time.Since(t0), nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return 0, fmt.Errorf("%s did not start again: see %s", r.name, r.log.Name())
}

// waitReady waits until ready holds (true) or the process exits (false).
func (r *restartable) waitReady(ctx context.Context, ready func(context.Context) error) bool {
	for {
		if err := ready(ctx); err == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-r.done:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// apiserverReady is a ready check of kube-apiserver: GET /readyz answers 200.
func apiserverReady(cfg *rest.Config) (func(context.Context) error, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	url := strings.TrimSuffix(cfg.Host, "/") + "/readyz"
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}, nil
}

// etcdReady is a ready check of etcd: its /health on the client URL answers 200.
func etcdReady(r *restartable) func(context.Context) error {
	u := r.argValue("advertise-client-urls")
	if i := strings.Index(u, ","); i >= 0 {
		u = u[:i]
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}
}

// apiservers are the kube-apiserver instances of the highly available control plane, all on the
// same etcd and behind the balancer, which took over the address envtest's kube-apiserver had (so
// every client, kube-controller-manager and kube-scheduler included, goes through it).
type apiservers struct {
	insts []*restartable
	ready []func(context.Context) error
	lb    *balancer

	mu         sync.Mutex
	restarting map[int]bool
}

// startAPIServers starts n instances with orig's command line, each on its own port and on the
// given etcd (comma-separated client URLs), waits until
// they are ready, kills orig (envtest's own) and puts the balancer on its address.
func startAPIServers(ctx context.Context, orig *restartable, n int, etcdServers, logDir string, cfg *rest.Config) (*apiservers, error) {
	a := &apiservers{restarting: map[int]bool{}}
	var addrs []string
	for i := range n {
		port, err := netport.Free("127.0.0.1")
		if err != nil {
			return a, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		log, err := os.Create(filepath.Join(logDir, fmt.Sprintf("kube-apiserver-%d.log", i)))
		if err != nil {
			return a, err
		}
		r := &restartable{name: fmt.Sprintf("kube-apiserver-%d", i), args: withArg(withArg(orig.args, "secure-port", fmt.Sprint(port)), "etcd-servers", etcdServers), dir: orig.dir, log: log,
			// kube-apiserver's start is mostly garbage (its OpenAPI document): 400 % costs a quarter
			// less CPU per restart here (2.4 against 3.1 CPU-seconds).
			env: []string{"GOGC=400"}}
		ready, err := readyAt(cfg, addr)
		if err != nil {
			return a, err
		}
		if err := r.start(); err != nil {
			return a, err
		}
		a.insts, a.ready, addrs = append(a.insts, r), append(a.ready, ready), append(addrs, addr)
	}
	for i, r := range a.insts {
		if !r.waitReady(ctx, a.ready[i]) {
			return a, fmt.Errorf("%s did not become ready: see %s", r.name, r.log.Name())
		}
	}
	if err := orig.kill(); err != nil {
		return a, err
	}
	lb, err := newBalancer("127.0.0.1:"+orig.argValue("secure-port"), addrs, cfg)
	a.lb = lb
	return a, err
}

// stop stops the balancer and the instances.
func (a *apiservers) stop() {
	if a.lb != nil {
		a.lb.close()
	}
	for _, r := range a.insts {
		r.stop()
	}
}

// claim picks an instance to restart, leaving at least one serving; -1 when none may go down now.
func (a *apiservers) claim(pick func(int) int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	var free []int
	for i := range a.insts {
		if !a.restarting[i] {
			free = append(free, i)
		}
	}
	if len(free) <= 1 {
		return -1
	}
	i := free[pick(len(free))]
	a.restarting[i] = true
	return i
}

// restart is a rolling restart of instance i: out of the balancer, SIGKILL, started again with
// the same command line, back in once it answers /readyz.
func (a *apiservers) restart(ctx context.Context, i int) (time.Duration, error) {
	defer func() {
		a.mu.Lock()
		delete(a.restarting, i)
		a.mu.Unlock()
	}()
	a.lb.setUp(i, false)
	d, err := a.insts[i].restart(ctx, a.ready[i])
	if err == nil {
		a.lb.setUp(i, true)
	}
	return d, err
}

// withArg is args with --flag=value (replacing the flag's value when present).
func withArg(args []string, flag, value string) []string {
	out := make([]string, 0, len(args)+1)
	found := false
	for _, x := range args {
		if strings.HasPrefix(x, "--"+flag+"=") {
			x, found = "--"+flag+"="+value, true
		}
		out = append(out, x)
	}
	if !found {
		out = append(out, "--"+flag+"="+value)
	}
	return out
}

// etcdCluster is the highly available control plane's etcd: three members (a fresh cluster; the
// kube-apiserver instances use it instead of envtest's single etcd), each restartable on its own.
// Elections are fast (heartbeat 50 ms, election timeout 500 ms), as on a local network.
type etcdCluster struct {
	members []*restartable
	urls    []string
}

// startEtcdCluster starts n members from the etcd binary of orig (envtest's etcd), without fsync
// as envtest runs it, and waits until every one answers /health.
func startEtcdCluster(ctx context.Context, orig *restartable, n int, logDir string) (*etcdCluster, error) {
	c := &etcdCluster{}
	var peers []string
	var clientPorts, peerPorts []int
	for i := range n {
		cp, err := netport.Free("127.0.0.1")
		if err != nil {
			return c, err
		}
		pp, err := netport.Free("127.0.0.1")
		if err != nil {
			return c, err
		}
		clientPorts, peerPorts = append(clientPorts, cp), append(peerPorts, pp)
		peers = append(peers, fmt.Sprintf("etcd-%d=http://127.0.0.1:%d", i, pp))
	}
	for i := range n {
		dir, err := os.MkdirTemp("", "kmm-chaos-etcd-")
		if err != nil {
			return c, err
		}
		log, err := os.Create(filepath.Join(logDir, fmt.Sprintf("etcd-%d.log", i)))
		if err != nil {
			return c, err
		}
		cu, pu := fmt.Sprintf("http://127.0.0.1:%d", clientPorts[i]), fmt.Sprintf("http://127.0.0.1:%d", peerPorts[i])
		r := &restartable{name: fmt.Sprintf("etcd-%d", i), dir: dir, log: log, args: []string{orig.args[0],
			"--name=etcd-" + fmt.Sprint(i), "--data-dir=" + dir, "--listen-client-urls=" + cu, "--advertise-client-urls=" + cu,
			"--listen-peer-urls=" + pu, "--initial-advertise-peer-urls=" + pu, "--initial-cluster=" + strings.Join(peers, ","),
			"--initial-cluster-state=new", "--heartbeat-interval=50", "--election-timeout=500", "--unsafe-no-fsync=true"}}
		if err := r.start(); err != nil {
			return c, err
		}
		c.members, c.urls = append(c.members, r), append(c.urls, cu)
	}
	for _, r := range c.members {
		if !r.waitReady(ctx, etcdReady(r)) {
			return c, fmt.Errorf("%s did not become ready: see %s", r.name, r.log.Name())
		}
	}
	return c, nil
}

// stop stops the members and removes their data.
func (c *etcdCluster) stop() {
	for _, r := range c.members {
		r.stop()
		_ = os.RemoveAll(r.dir)
	}
}
