package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kmm-project/kmm/test/netport"
)

// operator is the kmm manager binary running as a separate process.
type operator struct {
	cmd     *exec.Cmd
	exited  chan error
	metrics string // http://host:port/metrics
	pprof   string // http://host:port
	log     *os.File
}

// startOperator runs the manager binary against kubeconfig, with the webhook served where envtest
// registered it, and waits until it is ready (its webhook serves).
func (h *harness) startOperator(ctx context.Context, name string) (*operator, error) {
	ports, err := netport.FreeN("127.0.0.1", 3)
	if err != nil {
		return nil, err
	}
	metricsAddr, probeAddr, pprofAddr := hostPort(ports[0]), hostPort(ports[1]), hostPort(ports[2])
	args := []string{"--kubeconfig", h.kubeconfig,
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", probeAddr, "--pprof-bind-address", pprofAddr,
		"--webhook-host", h.env.WebhookHost, "--webhook-port", strconv.Itoa(h.env.WebhookPort), "--webhook-cert-dir", h.env.WebhookCertDir}
	args = append(args, h.o.OperatorArgs...)
	log, err := os.Create(filepath.Join(h.o.OutDir, fmt.Sprintf("operator-%dx%d-%s.log", h.o.Nodes, h.o.Modules, name)))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(h.o.Manager, args...) //nolint:gosec // G204: the harness runs the operator binary it was given
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting the operator: %w", err)
	}
	op := &operator{cmd: cmd, exited: make(chan error, 1), metrics: "http://" + metricsAddr + "/metrics", pprof: "http://" + pprofAddr, log: log}
	go func() { op.exited <- cmd.Wait() }()
	h.operatorArgs = args
	ready := "http://" + probeAddr + "/readyz"
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-op.exited:
			return nil, fmt.Errorf("the operator exited at start (%v): see %s", err, log.Name())
		case <-ctx.Done():
			op.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if resp, err := http.Get(ready); err == nil { //nolint:gosec,noctx // G107: our own endpoint
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return op, nil
			}
		}
		if time.Now().After(deadline) {
			op.stop()
			return nil, fmt.Errorf("the operator was not ready within 60 s: see %s", log.Name())
		}
	}
}

// stop ends the operator (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (op *operator) stop() {
	_ = op.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-op.exited:
		_ = err // a signalled process exits with an error
	case <-time.After(10 * time.Second):
		_ = op.cmd.Process.Kill()
		err := <-op.exited
		_ = err
	}
	_ = op.log.Close()
}

// stats are the operator process's peak RSS (MiB) and CPU seconds so far.
func (op *operator) stats() (float64, float64, error) {
	return procStats(op.cmd.Process.Pid)
}

// reconciles sums controller_runtime_reconcile_total by controller.
func (op *operator) reconciles(ctx context.Context) (map[string]int, error) {
	out, _, err := op.counters(ctx)
	return out, err
}

// counters are the reconciles by controller and the work queues' time sums by queue.
func (op *operator) counters(ctx context.Context) (map[string]int, map[string]queueSums, error) {
	samples, err := scrape(ctx, http.DefaultClient, op.metrics, "controller_runtime_reconcile_total",
		"workqueue_queue_duration_seconds_sum", "workqueue_queue_duration_seconds_count", "workqueue_work_duration_seconds_sum")
	if err != nil {
		return nil, nil, err
	}
	out, queues := map[string]int{}, map[string]queueSums{}
	for _, s := range samples {
		q := queues[s.labels["name"]]
		switch s.name {
		case "controller_runtime_reconcile_total":
			out[s.labels["controller"]] += int(s.value)
			continue
		case "workqueue_queue_duration_seconds_sum":
			q.waited += s.value
		case "workqueue_queue_duration_seconds_count":
			q.items += s.value
		case "workqueue_work_duration_seconds_sum":
			q.worked += s.value
		}
		queues[s.labels["name"]] = q
	}
	return out, queues, nil
}

// queueSums are a work queue's counters: seconds its items waited, items taken, seconds of work.
type queueSums struct{ waited, items, worked float64 }

// Queue is what a controller's work queue did during a phase (issue 41: which wait makes the
// difference): items taken, their mean wait in the queue and mean time being worked on.
type Queue struct {
	Items        int     `json:"items"`
	MeanWaitMs   float64 `json:"meanWaitMs"`
	MeanWorkMs   float64 `json:"meanWorkMs"`
	BusyWorkersS float64 `json:"busyWorkerSeconds"`
}

// queuesBetween are the queues' figures between two scrapes.
func queuesBetween(a, b map[string]queueSums) map[string]Queue {
	out := map[string]Queue{}
	for name, q := range b {
		p := a[name]
		items := q.items - p.items
		if items <= 0 {
			continue
		}
		out[name] = Queue{Items: int(items), MeanWaitMs: (q.waited - p.waited) / items * 1000,
			MeanWorkMs: (q.worked - p.worked) / items * 1000, BusyWorkersS: q.worked - p.worked}
	}
	return out
}

// profile saves a CPU profile of the operator over seconds to path.
func (op *operator) profile(ctx context.Context, seconds int, path string) error {
	return saveProfile(ctx, http.DefaultClient, op.pprof, seconds, path)
}

// saveProfile saves the CPU profile served under base (…/debug/pprof/profile) over seconds to path.
func saveProfile(ctx context.Context, c *http.Client, base string, seconds int, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, seconds), nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.ReadFrom(resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func hostPort(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
