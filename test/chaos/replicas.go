package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// replica is one manager process, behind its own proxy, kept running by a supervisor that starts
// it again whenever it exits (killed by the injector, or exiting on a lost Lease).
type replica struct {
	name       string
	binary     string
	args       []string
	env        []string
	proxy      *proxy
	kubeconfig string
	logPath    string

	mu     sync.Mutex
	cmd    *exec.Cmd
	starts int
	// lostExits counts the exits the injector did not cause (a replica exits when it loses its Lease);
	// killing is set between a kill and the exit it causes.
	lostExits int
	killing   bool
	stopped   bool
	done      chan struct{}
}

// newReplica writes the replica's kubeconfig (its proxy, no credentials: the proxy authenticates).
func newReplica(name, binary, dir string, p *proxy, args, env []string) (*replica, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: "http://" + p.addr}
	kc.AuthInfos["none"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "none"}
	kc.CurrentContext = "proxy"
	path := filepath.Join(dir, "kubeconfig-"+name)
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return nil, err
	}
	return &replica{name: name, binary: binary, args: args, env: env, proxy: p, kubeconfig: path,
		logPath: filepath.Join(dir, "manager-"+name+".log"), done: make(chan struct{})}, nil
}

// run starts the supervisor.
func (r *replica) run() {
	go func() {
		defer close(r.done)
		log, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return
		}
		defer func() { _ = log.Close() }()
		for {
			r.mu.Lock()
			if r.stopped {
				r.mu.Unlock()
				return
			}
			args := append([]string{"--kubeconfig", r.kubeconfig}, r.args...)
			cmd := exec.Command(r.binary, args...) //nolint:gosec // G204: the manager binary the harness built
			cmd.Stdout, cmd.Stderr = log, log
			cmd.Env = append(os.Environ(), r.env...)
			r.starts++
			_, _ = fmt.Fprintf(log, "=== chaos: start %d of replica %s at %s\n", r.starts, r.name, time.Now().Format(time.RFC3339Nano))
			if err := cmd.Start(); err != nil {
				r.mu.Unlock()
				_, _ = fmt.Fprintf(log, "=== chaos: start failed: %v\n", err)
				time.Sleep(time.Second)
				continue
			}
			r.cmd = cmd
			r.mu.Unlock()
			err := cmd.Wait()
			_, _ = fmt.Fprintf(log, "=== chaos: replica %s exited: %v\n", r.name, err)
			r.mu.Lock()
			if !r.killing {
				r.lostExits++
			}
			r.killing = false
			r.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	}()
}

// kill sends SIGKILL to the running process (the supervisor starts it again).
func (r *replica) kill() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil || r.cmd.ProcessState != nil {
		return false
	}
	r.killing = r.cmd.Process.Signal(syscall.SIGKILL) == nil
	return r.killing
}

// exitsOnLostLease is how many times the process exited without being killed.
func (r *replica) exitsOnLostLease() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lostExits
}

// stop ends the supervisor and the process.
func (r *replica) stop() {
	r.mu.Lock()
	r.stopped = true
	cmd := r.cmd
	r.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	<-r.done
}

// startCount is how many times the supervisor started the process.
func (r *replica) startCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}
