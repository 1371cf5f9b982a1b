package testbed

import (
	"context"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
)

// Watch watches the objects of list for the rest of the test and hands each event's object, in
// order, to observe on a goroutine of its own.
func Watch[T client.Object](t *testing.T, c *Cluster, list client.ObjectList, observe func(watch.EventType, T), opts ...client.ListOption) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := watchEach(ctx, c, list, observe, opts...); err != nil {
		t.Fatal(err)
	}
}

// watchEach is Watch until ctx ends.
func watchEach[T client.Object](ctx context.Context, c *Cluster, list client.ObjectList, observe func(watch.EventType, T), opts ...client.ListOption) error {
	wc, err := client.NewWithWatch(c.Env.Config, client.Options{Scheme: app.NewScheme()})
	if err != nil {
		return err
	}
	w, err := wc.Watch(ctx, list, opts...)
	if err != nil {
		return err
	}
	go func() {
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(T); ok {
				observe(ev.Type, o)
			}
		}
	}()
	return nil
}

// podWatch checks invariant 3 over the whole run: it watches every worker pod and records a
// violation whenever two exist for one (node, module) pair.
type podWatch struct {
	mu    sync.Mutex
	live  map[string]map[string]bool // pair → pod UIDs
	viols []string
	seen  int
}

func (w *podWatch) start(ctx context.Context, c *Cluster) error {
	return watchEach(ctx, c, &corev1.PodList{}, w.observe, client.MatchingLabels{contract.LabelWorker: "true"})
}

func (w *podWatch) observe(t watch.EventType, p *corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pair := p.Spec.NodeName + "/" + p.Labels[contract.LabelModuleNamespace] + "/" + p.Labels[contract.LabelModuleName]
	if w.live[pair] == nil {
		w.live[pair] = map[string]bool{}
	}
	if t == watch.Deleted {
		delete(w.live[pair], string(p.UID))
		return
	}
	w.live[pair][string(p.UID)] = true
	w.seen++
	if len(w.live[pair]) > 1 {
		w.viols = append(w.viols, fmt.Sprintf("%d worker pods for %s", len(w.live[pair]), pair))
	}
}

func (w *podWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

func (w *podWatch) violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.viols...)
}
