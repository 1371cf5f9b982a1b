package controllers_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestNodePairsFoldIntoOneStatusWrite: three Modules created together start their pairs on a node
// in one NMC status write (all three Loading), and when the node's three worker pods end apart,
// but within the NMC controller's coalescing window, one status write makes all three Loaded and
// one node patch adds their ready labels (issue 41, round four). The pods end 300 ms apart in a
// 3 s window; without the window the first pod's end is reconciled on its own.
func TestNodePairsFoldIntoOneStatusWrite(t *testing.T) {
	cluster.StartOperatorWith(t, func(o *app.Options) { o.NMCCoalesceWindow = 3 * time.Second })
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	var mu sync.Mutex
	released := map[string]bool{} // worker pod names the agent may end
	hold := func(p *corev1.Pod) bool {
		mu.Lock()
		defer mu.Unlock()
		return p.Labels[contract.LabelModuleNamespace] == tb.NS && !released[p.Name]
	}
	node.SetHold(hold)
	t.Cleanup(func() { node.SetHold(nil) })

	statuses := map[string][]string{} // by node: each distinct status the watch saw
	labels := map[string][]string{}   // by node: each distinct set of the bed's ready labels
	modules := []string{"a", "b", "c"}
	testbed.Watch(t, cluster, &kmmv1beta1.NodeModulesConfigList{}, func(_ watch.EventType, nmc *kmmv1beta1.NodeModulesConfig) {
		if !slices.Contains(tb.Nodes, nmc.Name) {
			return
		}
		var states []string
		for _, st := range nmc.Status.Modules {
			states = append(states, st.Name+"="+string(st.State))
		}
		mu.Lock()
		defer mu.Unlock()
		if s := strings.Join(states, ","); len(statuses[nmc.Name]) == 0 || statuses[nmc.Name][len(statuses[nmc.Name])-1] != s {
			statuses[nmc.Name] = append(statuses[nmc.Name], s)
		}
	})
	testbed.Watch(t, cluster, &corev1.NodeList{}, func(_ watch.EventType, n *corev1.Node) {
		var set []string
		for _, m := range modules {
			if _, ok := n.Labels[kmmv1beta1.ReadyLabel(tb.NS, m)]; ok {
				set = append(set, m)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if s := strings.Join(set, ","); slices.Contains(tb.Nodes, n.Name) && (len(labels[n.Name]) == 0 || labels[n.Name][len(labels[n.Name])-1] != s) {
			labels[n.Name] = append(labels[n.Name], s)
		}
	})

	for _, m := range modules {
		tb.Create(tb.Module(m))
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if got := len(workerPodsOn(t, n)); got != len(modules) {
				return false, fmt.Sprintf("%d held load pods on %s, want %d", got, n, len(modules))
			}
		}
		return true, ""
	})
	// The pods of each node end one after the other, 300 ms apart.
	for _, n := range tb.Nodes {
		for _, p := range workerPodsOn(t, n) {
			mu.Lock()
			released[p.Name] = true
			mu.Unlock()
			node.SetHold(hold) // the agent looks at its held pods again
			time.Sleep(300 * time.Millisecond)
		}
	}
	for _, m := range modules {
		tb.WaitLoaded(m, "reg.example.com/"+m+":a", tb.Nodes...)
	}
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range tb.Nodes {
			if l := labels[n]; len(l) == 0 || l[len(l)-1] != "a,b,c" {
				return false, fmt.Sprintf("the ready labels of %s: %q", n, l)
			}
		}
		return true, ""
	})
	mu.Lock()
	defer mu.Unlock()
	for _, n := range tb.Nodes {
		want := []string{"", "a=Loading,b=Loading,c=Loading", "a=Loaded,b=Loaded,c=Loaded"}
		if !slices.Equal(statuses[n], want) {
			t.Errorf("the NMC status of %s went %q, want %q: one write per step for the three pairs", n, statuses[n], want)
		}
		if want := []string{"", "a,b,c"}; !slices.Equal(labels[n], want) {
			t.Errorf("the ready labels of %s went %q, want %q: one patch", n, labels[n], want)
		}
	}
}

// podPosts is a transport that holds each worker pod creation in one namespace until n of them are
// in flight at once (or a timeout passes) and records the most it saw.
type podPosts struct {
	ns      string
	n       int
	mu      sync.Mutex
	flight  int
	most    int
	reached chan struct{}
}

// through is one client's transport through p.
type through struct {
	*podPosts
	next http.RoundTripper
}

func (t through) RoundTrip(req *http.Request) (*http.Response, error) {
	p := t.podPosts
	if req.Method != http.MethodPost || req.URL.Path != "/api/v1/namespaces/"+p.ns+"/pods" {
		return t.next.RoundTrip(req)
	}
	p.mu.Lock()
	p.flight++
	p.most = max(p.most, p.flight)
	if p.flight == p.n {
		close(p.reached)
	}
	p.mu.Unlock()
	select {
	case <-p.reached:
	case <-time.After(5 * time.Second):
	}
	p.mu.Lock()
	p.flight--
	p.mu.Unlock()
	return t.next.RoundTrip(req)
}

// TestPairsPodsCreatedSideBySide: a reconcile that starts three pairs creates their worker pods
// side by side, not one after the other (issue 41, round four): each creation is held until all
// three are in flight; one at a time, each waits out the 5 s and at most one is ever in flight.
func TestPairsPodsCreatedSideBySide(t *testing.T) {
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	posts := &podPosts{ns: tb.NS, n: 3, reached: make(chan struct{})}
	cluster.StartOperatorWithConfig(t, func(o *app.Options) { o.NMCCoalesceWindow = 3 * time.Second }, func(cfg *rest.Config) {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return through{podPosts: posts, next: rt} })
	})
	for _, m := range []string{"a", "b", "c"} {
		tb.Create(tb.Module(m))
	}
	for _, m := range []string{"a", "b", "c"} {
		tb.WaitLoaded(m, "reg.example.com/"+m+":a", tb.Nodes...)
	}
	posts.mu.Lock()
	defer posts.mu.Unlock()
	if posts.most != 3 {
		t.Errorf("at most %d worker pod creations in flight at once, want 3", posts.most)
	}
}

// TestLastWorkerPodEndNotDelayed: the end of a node's only running worker pod has nothing to fold
// and is reconciled at once, not after the NMC controller's coalescing window (at 1,000 × 1 the
// window was a wait at the back of every node). With a 10 s window (the bound), the pair is Loaded well
// within it after its pod ended.
func TestLastWorkerPodEndNotDelayed(t *testing.T) {
	const window = 10 * time.Second
	cluster.StartOperatorWith(t, func(o *app.Options) { o.NMCCoalesceWindow = window })
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	var mu sync.Mutex
	release := false
	hold := func(p *corev1.Pod) bool {
		mu.Lock()
		defer mu.Unlock()
		return p.Labels[contract.LabelModuleNamespace] == tb.NS && !release
	}
	node.SetHold(hold)
	t.Cleanup(func() { node.SetHold(nil) })
	tb.Create(tb.Module("a"))
	testbed.Eventually(t, 2*window, func() (bool, string) {
		return len(workerPodsOn(t, tb.Nodes[0])) == 1, "the held load pod"
	})
	mu.Lock()
	release = true
	mu.Unlock()
	start := time.Now()
	node.SetHold(hold) // the agent looks at its held pod again
	tb.WaitLoaded("a", "reg.example.com/a:a", tb.Nodes...)
	if took := time.Since(start); took > window/2 {
		t.Fatalf("the pair was Loaded %v after its only worker pod was released, want well within the %v window: the end waited the window", took.Round(time.Millisecond), window)
	}
	t.Logf("Loaded %v after the release", time.Since(start).Round(time.Millisecond))
}
