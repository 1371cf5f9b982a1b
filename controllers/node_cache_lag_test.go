package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/testbed"
)

// nodeCacheLag is the manager's client with a node cache that lags the operator's own label
// patches: for lag after each patch of a Node, a Get of that Node returns it as it was before the
// patch. It records every label patch and every NMC status write the operator sends, by node.
type nodeCacheLag struct {
	client.Client
	lag time.Duration

	mu       sync.Mutex
	stale    map[string]staleNode
	patches  map[string][]string // label patch bodies, by node
	statuses map[string][]string // NMC status.modules written, JSON, by node
}

type staleNode struct {
	node  *corev1.Node
	until time.Time
}

func newNodeCacheLag(c client.Client, lag time.Duration) *nodeCacheLag {
	return &nodeCacheLag{Client: c, lag: lag, stale: map[string]staleNode{}, patches: map[string][]string{}, statuses: map[string][]string{}}
}

func (c *nodeCacheLag) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if n, ok := obj.(*corev1.Node); ok {
		c.mu.Lock()
		s, has := c.stale[key.Name]
		c.mu.Unlock()
		if has && time.Now().Before(s.until) {
			s.node.DeepCopyInto(n)
			return nil
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c *nodeCacheLag) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if n, ok := obj.(*corev1.Node); ok {
		before := &corev1.Node{}
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(n), before); err != nil {
			return err
		}
		data, err := patch.Data(obj)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.stale[n.Name] = staleNode{node: before, until: time.Now().Add(c.lag)}
		c.patches[n.Name] = append(c.patches[n.Name], string(data))
		c.mu.Unlock()
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *nodeCacheLag) Status() client.SubResourceWriter {
	return statusLog{SubResourceWriter: c.Client.Status(), c: c}
}

// statusLog records the NMC status writes of a nodeCacheLag.
type statusLog struct {
	client.SubResourceWriter
	c *nodeCacheLag
}

func (s statusLog) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if nmc, ok := obj.(*kmmv1beta1.NodeModulesConfig); ok {
		data, err := json.Marshal(nmc.Status.Modules)
		if err != nil {
			return err
		}
		s.c.mu.Lock()
		s.c.statuses[nmc.Name] = append(s.c.statuses[nmc.Name], string(data))
		s.c.mu.Unlock()
	}
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

// repeats lists the writes of node that send again what the one before them sent.
func (c *nodeCacheLag) repeats(node string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for what, bodies := range map[string][]string{"label patch": c.patches[node], "NMC status write": c.statuses[node]} {
		for i := 1; i < len(bodies); i++ {
			if bodies[i] == bodies[i-1] {
				out = append(out, fmt.Sprintf("%s %d of %d repeats %s", what, i+1, len(bodies), bodies[i]))
			}
		}
	}
	return out
}

// TestOwnLabelPatchNotRepeatedOnALaggingNodeCache: a reconcile that reads the node from a cache
// that has not yet seen kmm's own label patch decides on the node as the patch left it. With a node
// cache 3 s behind every label patch, loading a Module on a node sends each label change once and
// no NMC status write equal to the one before it. Without the overlay the NMC status write's own
// event brought a reconcile that wrote the unchanged status again (the fence before a label change)
// and patched the same ready label again: the repeat TestSmoke met at scale.
func TestOwnLabelPatchNotRepeatedOnALaggingNodeCache(t *testing.T) {
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	var lag *nodeCacheLag
	cluster.StartOperatorWith(t, wrapOperatorClient(func(c client.Client) client.Client {
		lag = newNodeCacheLag(c, 3*time.Second)
		return lag
	}))
	m := tb.Module("nic")
	tb.Create(m)
	tb.WaitLoaded("nic", m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage, n)
	ready := kmmv1beta1.ReadyLabel(tb.NS, "nic")
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		node := &corev1.Node{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Name: n}, node); err != nil {
			return false, err.Error()
		}
		_, has := node.Labels[ready]
		return has, "the ready label " + ready + " on " + n
	})
	// The lag runs out, and the reconciles of the label's own event and of any requeue go by.
	time.Sleep(2 * lag.lag)
	if r := lag.repeats(n); len(r) > 0 {
		t.Errorf("writes repeated on %s: %v", n, r)
	}
	lag.mu.Lock()
	defer lag.mu.Unlock()
	if len(lag.patches[n]) == 0 || len(lag.statuses[n]) < 2 {
		t.Errorf("%s: %d label patches and %d NMC status writes, want at least 1 and 2: the test saw nothing", n, len(lag.patches[n]), len(lag.statuses[n]))
	}
	t.Logf("%s: label patches %v; NMC status writes %d", n, lag.patches[n], len(lag.statuses[n]))
}
