package agent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// nodeLeaseNamespace holds the kubelets' node Leases.
const nodeLeaseNamespace = corev1.NamespaceNodeLease

// heartbeatWriters is how many heartbeat writes the agent has in flight at once.
const heartbeatWriters = 8

// heartbeatTick is how often the heartbeat loop hands out the writes that are due.
const heartbeatTick = 100 * time.Millisecond

// heartbeats renews every managed node's Lease every Options.LeasePeriod and posts its status again
// every Options.StatusPeriod (new heartbeat times, as a kubelet does), each spread evenly over its
// period, until ctx ends. A write that fails is tried again at the node's next turn.
func (a *Agent) heartbeats(ctx context.Context) {
	work := make(chan func(context.Context), heartbeatWriters)
	var wg sync.WaitGroup
	for range heartbeatWriters {
		wg.Go(func() {
			for w := range work {
				w(ctx)
			}
		})
	}
	defer func() { close(work); wg.Wait() }()
	leases := &leaseBook{m: map[string]*coordinationv1.Lease{}}
	turns := []*turns{
		{period: a.opts.LeasePeriod, write: func(ctx context.Context, node string) { a.renewLeaseLogged(ctx, leases, node) }},
		{period: a.opts.StatusPeriod, write: func(ctx context.Context, node string) { a.postStatusLogged(ctx, node) }},
	}
	ticker := a.clock.NewTicker(heartbeatTick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		nodes := a.nodeNames()
		for _, t := range turns {
			for _, node := range t.due(nodes, a.clock.Now()) {
				write := t.write
				select {
				case work <- func(ctx context.Context) { write(ctx, node) }:
				case <-ctx.Done():
					return
				}
			}
		}
	}
}

// turns hands out one kind of heartbeat: every node once per period, in name order.
type turns struct {
	period time.Duration
	write  func(context.Context, string)
	start  time.Time
	done   int // writes handed out since start
}

// due returns the nodes whose turn came by now.
func (t *turns) due(nodes []string, now time.Time) []string {
	if t.period <= 0 || len(nodes) == 0 {
		return nil
	}
	if t.start.IsZero() {
		t.start = now
	}
	want := int(float64(len(nodes)) * float64(now.Sub(t.start)) / float64(t.period))
	// No catching up: turns missed while the writers were behind (or while the nodes were being
	// added) are dropped, as a kubelet's late renewal replaces the one it missed. Without this,
	// a 1,000-node run renewed 248 Leases a second for a minute after its setup instead of 100.
	if lag := 2 * (len(nodes)*int(heartbeatTick)/int(t.period) + 1); want-t.done > lag {
		t.done = want - lag
	}
	var out []string
	for ; t.done < want; t.done++ {
		out = append(out, nodes[t.done%len(nodes)])
	}
	return out
}

// nodeNames are the managed nodes, sorted.
func (a *Agent) nodeNames() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.nodes))
	for n := range a.nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// leaseBook holds the last Lease written per node, as a kubelet keeps its own.
type leaseBook struct {
	mu sync.Mutex
	m  map[string]*coordinationv1.Lease
}

func (a *Agent) renewLeaseLogged(ctx context.Context, book *leaseBook, node string) {
	if err := a.renewLease(ctx, book, node); err != nil && ctx.Err() == nil {
		a.log.Error(err, "Renewing a node Lease", "node", node)
	}
}

// renewLease updates node's Lease with a new renew time from the Lease it wrote last (one PUT, as
// a kubelet does); it reads or creates the Lease when it has none or the update conflicts.
func (a *Agent) renewLease(ctx context.Context, book *leaseBook, node string) error {
	book.mu.Lock()
	lease := book.m[node]
	book.mu.Unlock()
	now := metav1.NewMicroTime(a.clock.Now())
	var err error
	if lease != nil {
		lease = lease.DeepCopy()
		lease.Spec.RenewTime = &now
		err = a.client.Update(ctx, lease)
	}
	if lease == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		lease, err = a.readOrCreateLease(ctx, node, now)
	}
	if err != nil {
		book.mu.Lock()
		delete(book.m, node)
		book.mu.Unlock()
		return fmt.Errorf("the Lease of node %s: %w", node, err)
	}
	book.mu.Lock()
	book.m[node] = lease
	book.mu.Unlock()
	return nil
}

// readOrCreateLease renews the Lease as stored, or creates it owned by its Node.
func (a *Agent) readOrCreateLease(ctx context.Context, node string, now metav1.MicroTime) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	err := a.client.Get(ctx, types.NamespacedName{Namespace: nodeLeaseNamespace, Name: node}, lease)
	if err == nil {
		lease.Spec.RenewTime = &now
		return lease, a.client.Update(ctx, lease)
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	var n corev1.Node
	if err := a.client.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
		return nil, err
	}
	lease = &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: nodeLeaseNamespace, Name: node, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: node, UID: n.UID}}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
	}
	return lease, a.client.Create(ctx, lease)
}

func (a *Agent) postStatusLogged(ctx context.Context, node string) {
	if err := a.postStatus(ctx, node); err != nil && ctx.Err() == nil {
		a.log.Error(err, "Posting a node's status", "node", node)
	}
}

// postStatus posts node's status again with new heartbeat times, as a kubelet does every
// nodeStatusReportFrequency: a read of the Node, then a status write, neither under the agent's
// lock (a conflict is left to the next turn; syncNode re-asserts what the agent says).
func (a *Agent) postStatus(ctx context.Context, name string) error {
	var node corev1.Node
	if err := a.client.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
		return err
	}
	a.mu.Lock()
	st := a.nodes[name]
	if st == nil {
		a.mu.Unlock()
		return nil
	}
	a.applyNodeStatus(&node.Status, st, a.now())
	a.mu.Unlock()
	return a.client.Status().Update(ctx, &node)
}

// realNodeStatus fills in what a real kubelet reports beyond what the agent decides (RealNodes):
// addresses, capacity, the pressure and network conditions, the node's system info and the list of
// images in its container runtime.
func realNodeStatus(s *corev1.NodeStatus, name string, now metav1.Time) {
	s.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP(name)}, {Type: corev1.NodeHostName, Address: name}}
	s.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("65843452Ki"), corev1.ResourceEphemeralStorage: resource.MustParse("203056560Ki"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0")}
	s.Allocatable = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("15890m"),
		corev1.ResourceMemory: resource.MustParse("64692476Ki"), corev1.ResourceEphemeralStorage: resource.MustParse("187136925387"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0")}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
		if !slices.ContainsFunc(s.Conditions, func(x corev1.NodeCondition) bool { return x.Type == c }) {
			setCondition(s, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficient" + string(c)[:len(c)-len("Pressure")],
				Message: "kubelet has no " + string(c), LastHeartbeatTime: now, LastTransitionTime: now})
		}
	}
	for i := range s.Conditions {
		s.Conditions[i].LastHeartbeatTime = now
	}
	s.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}}
	s.NodeInfo.MachineID = fmt.Sprintf("%032x", hash64(name))
	s.NodeInfo.SystemUUID = fmt.Sprintf("ec2%05x-%04x-%04x-%04x-%012x", hash64(name)&0xfffff, hash64(name+"a")&0xffff, hash64(name+"b")&0xffff, hash64(name+"c")&0xffff, hash64(name+"d")&0xffffffffffff)
	s.NodeInfo.ContainerRuntimeVersion = "containerd://1.7.27"
	s.Images = nodeImages
}

// nodeImages is the image list of every real-looking node: 50 images, the size of a busy node's.
var nodeImages = func() []corev1.ContainerImage {
	out := make([]corev1.ContainerImage, 0, 50)
	for i := range 50 {
		repo := fmt.Sprintf("registry.example.com/team-%d/service-%d", i%7, i)
		digest := fmt.Sprintf("%064x", hash64(repo))
		out = append(out, corev1.ContainerImage{Names: []string{repo + "@sha256:" + digest, repo + fmt.Sprintf(":v1.%d.%d", i%13, i%5)},
			SizeBytes: int64(20_000_000 + i*7_340_033)})
	}
	return out
}()

// internalIP is a node's made-up address in 10.0.0.0/8.
func internalIP(name string) string {
	h := hash64(name)
	return fmt.Sprintf("10.%d.%d.%d", h>>16&0xff, h>>8&0xff, h&0xff|1)
}

// hash64 is FNV-1a of s.
func hash64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
