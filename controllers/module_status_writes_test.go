package controllers_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/internal/semantic"
	"github.com/kmm-project/kmm/test/testbed"
)

// statusWrite is one Module status write as a watch saw it.
type statusWrite struct {
	at      time.Time
	summary string // observed generation, and each condition's status and reason
	ready   string // the Ready condition's message
}

// TestModuleStatusWrittenAtMostOncePerSecond: while the pairs of a Module finish one after the
// other, its status (the counters) is written at most once per ModuleStatusDelay, but for a change
// of its summary (a condition's status or reason, the observed generation), which is written at
// once. Before issue 22 each status write was followed at once by a reconcile that wrote again.
func TestModuleStatusWrittenAtMostOncePerSecond(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 10, testbed.KernelA)
	var mu sync.Mutex
	released := map[string]bool{}
	node.SetHold(func(p *corev1.Pod) bool {
		mu.Lock()
		defer mu.Unlock()
		return p.Namespace == tb.NS && !released[p.Spec.NodeName]
	})
	t.Cleanup(func() { node.SetHold(nil) })
	var writes []statusWrite
	var last *kmmv1beta1.ModuleStatus
	testbed.Watch(t, cluster, &kmmv1beta1.ModuleList{}, func(_ watch.EventType, m *kmmv1beta1.Module) {
		mu.Lock()
		defer mu.Unlock()
		if last != nil && semantic.Equal(last, &m.Status) {
			return
		}
		last = m.Status.DeepCopy()
		w := statusWrite{at: time.Now(), summary: fmt.Sprint(m.Status.ObservedGeneration)}
		for _, c := range m.Status.Conditions {
			w.summary += fmt.Sprintf(" %s=%s/%s", c.Type, c.Status, c.Reason)
		}
		if c := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionReady); c != nil {
			w.ready = c.Message
		}
		writes = append(writes, w)
	}, client.InNamespace(tb.NS))
	tb.Create(tb.Module("nic"))
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if len(workerPodsOn(t, n)) != 1 {
				return false, "a held load pod on " + n
			}
		}
		return true, ""
	})
	// The pairs finish one by one, 150 ms apart: the counters change ~7 times a second.
	for _, n := range tb.Nodes {
		mu.Lock()
		released[n] = true
		mu.Unlock()
		node.SetHold(func(p *corev1.Pod) bool {
			mu.Lock()
			defer mu.Unlock()
			return p.Namespace == tb.NS && !released[p.Spec.NodeName]
		})
		time.Sleep(150 * time.Millisecond)
	}
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return last != nil && meta.IsStatusConditionTrue(last.Conditions, kmmv1beta1.ConditionReady), "the Module Ready"
	})
	time.Sleep(2 * module.StatusDelay) // any write still to come
	mu.Lock()
	defer mu.Unlock()
	assertStatusWritesSpaced(t, writes, len(tb.Nodes))
}

// assertStatusWritesSpaced checks that two status writes closer than half a ModuleStatusDelay (as
// the watch saw them) differ in their summary, and that the counters were written at all.
func assertStatusWritesSpaced(t *testing.T, writes []statusWrite, nodes int) {
	t.Helper()
	for i := 1; i < len(writes); i++ {
		prev, cur := writes[i-1], writes[i]
		if gap := cur.at.Sub(prev.at); gap < module.StatusDelay/2 && prev.summary == cur.summary {
			t.Errorf("status writes %d and %d only %v apart with the same summary %q (%q, then %q)",
				i-1, i, gap.Round(time.Millisecond), cur.summary, prev.ready, cur.ready)
		}
	}
	if n := len(writes); n < 2 || writes[n-1].ready != fmt.Sprintf("loaded on %d of %d nodes", nodes, nodes) {
		t.Errorf("%d status writes, the last %+v: want the Module Ready on all %d nodes at the end", n, writes[n-1], nodes)
	}
	t.Logf("%d Module status writes", len(writes))
}
