package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kmm-project/kmm/test/poll"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestStatusWatch follows `kubectl kmm status -w` while the test writes NMC status (no operator
// runs: the test is the only writer). The server closes each watch request after a second; the
// first change is written only after the plugin has made a second watch request, so it reaches
// the plugin on a re-established watch. Seeded fault: a follow that stops when its first watch
// ends (no RetryWatcher, no relist) misses that change and the test fails waiting for its line.
func TestStatusWatch(t *testing.T) {
	ctx := context.Background()
	kubeconfig := writeKubeconfig(t, cluster.Env)
	const ns = "watch-test"
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: "watch-node-1"}}
	if err := cluster.Client.Create(ctx, nmc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.Delete(ctx, nmc) })
	setPairs(t, nmc.Name, pair(ns, "nic", kmmv1beta1.StateLoading, "SpecSet", "loading nic"),
		pair(ns, "gpu", kmmv1beta1.StateLoaded, "WorkerSucceeded", ""))

	var watches atomic.Int32
	out := &syncBuffer{}
	wctx, cancel := context.WithCancel(ctx)
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runErr = runWith(wctx, []string{"status", "-w", "-n", ns, "--kubeconfig", kubeconfig, "--width", "120"}, out, out,
			&watchHooks{timeout: time.Second, opened: func() { watches.Add(1) }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	lines := func() []string { return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") }
	waitLines(t, out, "the table with both pairs", func(l []string) bool {
		return len(l) == 3 && strings.HasPrefix(l[0], "NODE") && has(l[1], "watch-node-1", ns+"/gpu", "Loaded") &&
			has(l[2], "watch-node-1", ns+"/nic", "Loading", "SpecSet: loading nic")
	})
	// Outlive the first watch request: wait for the second one, or, if it never comes, for
	// longer than its timeout (the change below must then still arrive, and cannot).
	for deadline := time.Now().Add(10 * time.Second); watches.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}

	// A change of state: one line, lined up under the table.
	setPairs(t, nmc.Name, pair(ns, "nic", kmmv1beta1.StateLoaded, "WorkerSucceeded", "loaded"),
		pair(ns, "gpu", kmmv1beta1.StateLoaded, "WorkerSucceeded", ""))
	waitLines(t, out, "a line for nic Loaded, written after the first watch request ended", func(l []string) bool {
		return len(l) == 4 && has(l[3], "watch-node-1", ns+"/nic", "Loaded", "WorkerSucceeded: loaded")
	})
	if n := watches.Load(); n < 2 {
		t.Fatalf("%d watch requests before the first change: the test did not outlive a watch", n)
	}
	if l := lines(); strings.Index(l[3], "Loaded") != strings.Index(l[0], "STATE") {
		t.Errorf("the change does not line up under STATE:\n%s", out.String())
	}

	// With -o, each change is one object through the printer: here the jsonpath of one row.
	jsonOut := &syncBuffer{}
	jctx, jcancel := context.WithCancel(ctx)
	jdone := make(chan struct{})
	go func() {
		defer close(jdone)
		_ = runWith(jctx, []string{"status", "-w", "-n", ns, "--kubeconfig", kubeconfig, "-o", `jsonpath={.module}={.state}{"\n"}`},
			jsonOut, jsonOut, nil)
	}()
	t.Cleanup(func() {
		jcancel()
		<-jdone
	})
	waitLines(t, jsonOut, "-o jsonpath: the two rows", func(l []string) bool {
		return strings.Join(l, ",") == ns+"/gpu=Loaded,"+ns+"/nic=Loaded"
	})

	// A new message alone is no change; the next change of reason after it is the only new line.
	setPairs(t, nmc.Name, pair(ns, "nic", kmmv1beta1.StateLoaded, "WorkerSucceeded", "loaded again"),
		pair(ns, "gpu", kmmv1beta1.StateLoaded, "WorkerSucceeded", ""))
	setPairs(t, nmc.Name, pair(ns, "nic", kmmv1beta1.StateLoaded, "WorkerSucceeded", "loaded again"),
		pair(ns, "gpu", kmmv1beta1.StateUnloading, "SpecRemoved", "unloading gpu"))
	waitLines(t, out, "one line for gpu Unloading", func(l []string) bool {
		return len(l) == 5 && has(l[4], "watch-node-1", ns+"/gpu", "Unloading", "SpecRemoved: unloading gpu")
	})
	waitLines(t, jsonOut, "-o jsonpath: the change of gpu, and nothing for the message", func(l []string) bool {
		return strings.Join(l, ",") == ns+"/gpu=Loaded,"+ns+"/nic=Loaded,"+ns+"/gpu=Unloading"
	})
	jcancel()
	<-jdone

	// An entry removed, then the whole NMC: each pair once, Absent Removed.
	setPairs(t, nmc.Name, pair(ns, "nic", kmmv1beta1.StateLoaded, "WorkerSucceeded", "loaded again"))
	waitLines(t, out, "gpu removed", func(l []string) bool {
		return len(l) == 6 && has(l[5], ns+"/gpu", "Absent", "Removed")
	})
	if err := cluster.Client.Delete(ctx, nmc); err != nil {
		t.Fatal(err)
	}
	waitLines(t, out, "nic removed with its NMC", func(l []string) bool {
		return len(l) == 7 && has(l[6], ns+"/nic", "Absent", "Removed")
	})
	t.Logf("kubectl kmm status -w (%d watch requests):\n%s", watches.Load(), out.String())

	cancel()
	select {
	case <-done:
		if runErr != nil {
			t.Errorf("status -w ended with %v on cancel, want nil", runErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("status -w did not end within 10s of its context's cancel")
	}
	if l := lines(); len(l) != 7 {
		t.Errorf("status -w printed more after the last change:\n%s", out.String())
	}
}

func pair(ns, name string, state kmmv1beta1.ModuleState, reason, message string) kmmv1beta1.NodeModuleStatus {
	return kmmv1beta1.NodeModuleStatus{Namespace: ns, Name: name, State: state, Reason: reason, Message: message}
}

// setPairs writes the NMC's status entries; an entry whose state or reason changed gets a new
// transition time (a second later than any before, as the API keeps whole seconds).
func setPairs(t *testing.T, name string, pairs ...kmmv1beta1.NodeModuleStatus) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		nmc := &kmmv1beta1.NodeModulesConfig{}
		if err := cluster.Client.Get(context.Background(), client.ObjectKey{Name: name}, nmc); err != nil {
			return err
		}
		latest := time.Now().Truncate(time.Second)
		old := map[string]kmmv1beta1.NodeModuleStatus{}
		for _, st := range nmc.Status.Modules {
			old[st.Namespace+"/"+st.Name] = st
			latest = maxTime(latest, st.LastTransitionTime.Add(time.Second))
		}
		nmc.Status.Modules = nil
		for _, p := range pairs {
			p.LastTransitionTime = metav1.NewTime(latest)
			if o, ok := old[p.Namespace+"/"+p.Name]; ok && o.State == p.State && o.Reason == p.Reason {
				p.LastTransitionTime = o.LastTransitionTime
			}
			nmc.Status.Modules = append(nmc.Status.Modules, p)
		}
		return cluster.Client.Status().Update(context.Background(), nmc)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// waitLines waits until the output's lines satisfy cond.
func waitLines(t *testing.T, out *syncBuffer, what string, cond func([]string) bool) {
	t.Helper()
	poll.Until(t, 20*time.Second, 50*time.Millisecond, func() (bool, string) {
		s := out.String()
		return cond(strings.Split(strings.TrimSuffix(s, "\n"), "\n")), what + "; output so far:\n" + s
	})
}

// has says whether line has every field, in order.
func has(line string, fields ...string) bool {
	for _, f := range fields {
		i := strings.Index(line, f)
		if i < 0 {
			return false
		}
		line = line[i+len(f):]
	}
	return true
}

// syncBuffer is a bytes.Buffer the command writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWatchRelistsWhenTheVersionExpired starts the NMC watch from a resourceVersion the API server
// no longer serves (410 Gone): the watch lists again and reports the NMCs of that list, then
// follows changes from there. Seeded fault: ending (or retrying the same version) on 410 instead of
// relisting never reports the NMC.
func TestWatchRelistsWhenTheVersionExpired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: "relist-node-1"}}
	if err := cluster.Client.Create(ctx, nmc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.Delete(context.Background(), nmc) })

	o := newRootOptions(genericiooptions.NewTestIOStreamsDiscard())
	*o.config.KubeConfig = writeKubeconfig(t, cluster.Env)
	s, err := o.connect()
	if err != nil {
		t.Fatal(err)
	}
	relisted := make(chan []string, 1)
	changed := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		done <- s.watchNMCs(ctx, nil, "1",
			func(name string, _ *kmmv1beta1.NodeModulesConfig) error { changed <- name; return nil },
			func(nmcs []kmmv1beta1.NodeModulesConfig) error {
				var names []string
				for _, n := range nmcs {
					names = append(names, n.Name)
				}
				select {
				case relisted <- names:
				default:
				}
				return nil
			})
	}()
	select {
	case names := <-relisted:
		if !slices.Contains(names, nmc.Name) {
			t.Fatalf("the relist has %v, want %s among them", names, nmc.Name)
		}
	case err := <-done:
		t.Fatalf("the watch ended with %v instead of listing again", err)
	case <-ctx.Done():
		t.Fatal("no relist within 30s of a watch from an expired resourceVersion")
	}
	// Changes after the relist reach observe.
	setPairs(t, nmc.Name, pair("relist", "nic", kmmv1beta1.StateLoading, "SpecSet", ""))
	for seen := false; !seen; {
		select {
		case name := <-changed:
			seen = name == nmc.Name
		case <-ctx.Done():
			t.Fatal("the status change after the relist did not reach observe")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("the watch ended with %v on cancel, want nil", err)
	}
}
