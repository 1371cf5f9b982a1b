//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/kmm-project/kmm/test/e2e"
	kmmenvtest "github.com/kmm-project/kmm/test/envtest"
)

// The tests share one cluster, brought up by the first test that needs it and torn down after the
// last (TestMain): bring-up and teardown happen once per run.
var shared struct {
	once    sync.Once
	cluster *e2e.Cluster
	err     error
	root    string // the repository
	dir     string // bin/e2e/run
}

// tm is the timing table printed at the end of the run.
var tm = &timings{start: time.Now()}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

// runMain runs the tests, then tears the cluster down: a teardown that leaves the host changed
// fails the run. On failure (or with KMM_E2E_KEEP set) the folder, with the daemons', the
// containers' and the operator's logs, moves to bin/e2e/failed-<time>.
func runMain(m *testing.M) int {
	code := m.Run()
	if shared.cluster != nil {
		start := time.Now()
		if err := shared.cluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "teardown: %v\n", err)
			code = 1
		}
		tm.add("teardown, host checked clean", start)
	}
	if shared.dir != "" {
		if code != 0 || os.Getenv("KMM_E2E_KEEP") != "" {
			keepLogs()
		} else if err := os.RemoveAll(shared.dir); err != nil {
			fmt.Fprintf(os.Stderr, "removing %s: %v\n", shared.dir, err)
			code = 1
		}
	}
	if len(tm.rows) > 0 {
		tm.print()
	}
	return code
}

// keepLogs moves the cluster's folder (logs only once Stop ran) to bin/e2e/failed-<time>.
func keepLogs() {
	failed := filepath.Join(shared.root, "bin", "e2e", "failed-"+time.Now().Format("20060102-150405"))
	if err := os.Rename(shared.dir, failed); err != nil {
		fmt.Fprintf(os.Stderr, "keeping the logs: %v\n", err)
		return
	}
	fmt.Fprintf(os.Stderr, "logs of the run: %s (logs/: daemons and the operator, pod-logs/: containers)\n", failed)
}

// cluster returns the run's cluster, starting it in bin/e2e/run on the first call.
func cluster(t *testing.T) *e2e.Cluster {
	t.Helper()
	shared.once.Do(func() {
		shared.root, shared.err = kmmenvtest.RepoRoot()
		if shared.err != nil {
			return
		}
		dir := filepath.Join(shared.root, "bin", "e2e", "run")
		if shared.err = e2e.Cleanup(dir); shared.err != nil { // a run that died there
			return
		}
		if shared.err = os.RemoveAll(dir); shared.err != nil {
			return
		}
		shared.dir = dir
		start := time.Now()
		shared.cluster, shared.err = e2e.Start(context.Background(), dir, e2e.Options{})
		if shared.err == nil {
			tm.add("bring-up: registry, control plane, containerd, kubelet registered", start)
		}
	})
	if shared.err != nil {
		t.Fatalf("starting the cluster: %v", shared.err)
	}
	return shared.cluster
}

// timings is the table the run prints at the end.
type timings struct {
	mu    sync.Mutex
	rows  [][2]string
	start time.Time
}

func (tm *timings) add(step string, since time.Time) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.rows = append(tm.rows, [2]string{step, fmt.Sprintf("%.1f s", time.Since(since).Seconds())})
}

// addSpan records a step measured between two instants (from a watch's timestamps).
func (tm *timings) addSpan(step string, from, to time.Time) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.rows = append(tm.rows, [2]string{step, fmt.Sprintf("%.1f s", to.Sub(from).Seconds())})
}

func (tm *timings) print() {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(w, "STEP\tTIME")
	for _, r := range tm.rows {
		_, _ = fmt.Fprintf(w, "%s\t%s\n", r[0], r[1])
	}
	_, _ = fmt.Fprintf(w, "total\t%.1f s\n", time.Since(tm.start).Seconds())
	_ = w.Flush()
}
