package agent

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// nodeState is what the agent says a managed node is; the Node's status is kept equal to it.
type nodeState struct {
	name   string
	kernel string
	bootID string
	ready  bool
	// readySince is the Ready condition's lastTransitionTime, whole seconds as the API stores it.
	readySince metav1.Time
	// loaded is the simulated kernel's modules by "<namespace>/<name>" of the Module.
	loaded map[string]kmmv1beta1.ModuleConfig
	// pressure are the node's pressure conditions that are True (DiskPressure, MemoryPressure,
	// PIDPressure), with the kubelet's taints on the Node.
	pressure map[corev1.NodeConditionType]bool
}

// pressureTaints are the taints the node lifecycle controller puts on a Node for each pressure
// condition (TaintNodesByCondition).
var pressureTaints = map[corev1.NodeConditionType]string{
	corev1.NodeDiskPressure:   corev1.TaintNodeDiskPressure,
	corev1.NodeMemoryPressure: corev1.TaintNodeMemoryPressure,
	corev1.NodePIDPressure:    corev1.TaintNodePIDPressure,
}

// Reasons of the Ready condition the agent writes, as a kubelet does.
const (
	reasonReady    = "KubeletReady"
	reasonNotReady = "KubeletNotReady"
)

// AddNode creates the Node name with labels (plus kubernetes.io/hostname and kubernetes.io/os when
// absent) and sets its status: kernel version, a new boot ID and Ready=True since now. The agent
// manages the node from then on.
func (a *Agent) AddNode(ctx context.Context, name, kernel string, labels map[string]string) error {
	if name == "" || kernel == "" {
		return errors.New("a simulated node needs a name and a kernel version")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.nodes[name] != nil {
		return fmt.Errorf("node %s is already managed by this agent", name)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels(name, labels)}}
	if err := a.client.Create(ctx, node); err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	st := &nodeState{name: name, kernel: kernel, bootID: newBootID(), ready: true, readySince: a.now(),
		loaded: map[string]kmmv1beta1.ModuleConfig{}}
	a.nodes[name] = st
	a.wakeNode(name)
	if err := a.writeNodeStatus(ctx, st); err != nil {
		return err
	}
	return a.clearNotReadyTaint(ctx, name)
}

// clearNotReadyTaint removes the not-ready taint the API server puts on new Nodes, as the node
// lifecycle controller does once a kubelet reports Ready.
func (a *Agent) clearNotReadyTaint(ctx context.Context, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var node corev1.Node
		if err := a.client.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
			return err
		}
		kept := node.Spec.Taints[:0]
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = kept
		return a.client.Update(ctx, &node)
	})
}

// RemoveNode stops managing node and deletes the Node. Its worker pods are left alone.
func (a *Agent) RemoveNode(ctx context.Context, node string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.nodes, node)
	err := a.client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting node %s: %w", node, err)
	}
	return nil
}

// Reboot simulates a quick reboot of node: a new boot ID, the Ready condition's lastTransitionTime
// moved to now with the node Ready again (no NotReady status is written in between; note that the
// API keeps whole seconds, so within the same second the time does not change), the simulated
// loaded modules cleared, and every worker pod on the node that had not ended, held or not yet
// started, Failed with reason Other, "the node rebooted", and the old boot ID.
func (a *Agent) Reboot(ctx context.Context, node string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, err := a.managed(node)
	if err != nil {
		return err
	}
	return a.reboot(ctx, st)
}

// SetKernel changes the kernel of node, which means a reboot (see Reboot).
func (a *Agent) SetKernel(ctx context.Context, node, kernel string) error {
	if kernel == "" {
		return errors.New("the kernel version is empty")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st, err := a.managed(node)
	if err != nil {
		return err
	}
	st.kernel = kernel
	return a.reboot(ctx, st)
}

// SetReady makes node Ready or NotReady, moving the Ready condition's lastTransitionTime to now when
// that changes. The agent neither runs nor deletes worker pods on a NotReady node: they stay as
// they are until it is Ready again.
func (a *Agent) SetReady(ctx context.Context, node string, ready bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, err := a.managed(node)
	if err != nil {
		return err
	}
	if st.ready != ready {
		st.ready, st.readySince = ready, a.now()
	}
	a.wakeNode(node)
	return a.writeNodeStatus(ctx, st)
}

// SetPressure puts node under (or takes it out of) a resource pressure, cond one of DiskPressure,
// MemoryPressure and PIDPressure: the condition in the Node's status and its NoSchedule taint, as the
// kubelet and the node lifecycle controller set them. Under pressure the agent admits worker pods as
// the kubelet's eviction manager does: a critical pod (priority of system-cluster-critical or more)
// always; under memory pressure alone a pod that is not BestEffort or tolerates the memory-pressure
// taint; any other pod is rejected, Failed with reason Evicted and no container status.
func (a *Agent) SetPressure(ctx context.Context, node string, cond corev1.NodeConditionType, on bool) error {
	taint, ok := pressureTaints[cond]
	if !ok {
		return fmt.Errorf("%s is not a pressure condition", cond)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st, err := a.managed(node)
	if err != nil {
		return err
	}
	if st.pressure == nil {
		st.pressure = map[corev1.NodeConditionType]bool{}
	}
	st.pressure[cond] = on
	if err := a.writeNodeStatus(ctx, st); err != nil {
		return err
	}
	a.wakeNode(node)
	return a.setTaint(ctx, node, corev1.Taint{Key: taint, Effect: corev1.TaintEffectNoSchedule}, on)
}

// setTaint adds or removes a taint of node.
func (a *Agent) setTaint(ctx context.Context, name string, taint corev1.Taint, on bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var node corev1.Node
		if err := a.client.Get(ctx, types.NamespacedName{Name: name}, &node); err != nil {
			return err
		}
		kept := node.Spec.Taints[:0:0]
		for _, t := range node.Spec.Taints {
			if t.Key != taint.Key {
				kept = append(kept, t)
			}
		}
		if on {
			kept = append(kept, taint)
		}
		node.Spec.Taints = kept
		return a.client.Update(ctx, &node)
	})
}

// BootID is the current boot ID of node, empty for a node the agent does not manage.
func (a *Agent) BootID(node string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if st := a.nodes[node]; st != nil {
		return st.bootID
	}
	return ""
}

// wakeNode has the loop look at the pods of node, whose state the agent changed: pods it left
// alone while the node was NotReady or not managed may now run.
func (a *Agent) wakeNode(node string) {
	a.changes.wake(node)
	a.poke()
}

// managed returns the state of a node the agent manages.
func (a *Agent) managed(node string) (*nodeState, error) {
	st := a.nodes[node]
	if st == nil {
		return nil, fmt.Errorf("node %s is not managed by this agent", node)
	}
	return st, nil
}

// reboot implements Reboot for st with a.mu held. The pods to fail are listed before the new boot
// ID is published, so a pod created in reaction to the reboot is run, not failed.
func (a *Agent) reboot(ctx context.Context, st *nodeState) error {
	var pods corev1.PodList
	if err := a.client.List(ctx, &pods, client.MatchingLabels{contract.LabelWorker: "true"},
		client.MatchingFields{"spec.nodeName": st.name}); err != nil {
		return fmt.Errorf("listing the worker pods of node %s: %w", st.name, err)
	}
	oldBootID := st.bootID
	st.bootID, st.ready, st.readySince = newBootID(), true, a.now()
	st.loaded = map[string]kmmv1beta1.ModuleConfig{}
	a.wakeNode(st.name)
	if err := a.writeNodeStatus(ctx, st); err != nil {
		return err
	}
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if isTerminal(pod) {
			continue
		}
		if err := a.failPod(ctx, st, pod, oldBootID, "the node rebooted"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncNode re-asserts the status of a managed node when the Node (as cached) differs from it.
func (a *Agent) syncNode(ctx context.Context, node *corev1.Node) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.nodes[node.Name]
	if st == nil || nodeMatches(&node.Status, st) {
		return nil
	}
	return a.writeNodeStatus(ctx, st)
}

// writeNodeStatus makes the Node's status say what st says. When it fails, the next pass of the
// loop tries again.
func (a *Agent) writeNodeStatus(ctx context.Context, st *nodeState) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var node corev1.Node
		if err := a.client.Get(ctx, types.NamespacedName{Name: st.name}, &node); err != nil {
			return err
		}
		a.applyNodeStatus(&node.Status, st, a.now())
		return a.client.Status().Update(ctx, &node)
	})
	if err != nil {
		a.changes.nodeChanged(st.name)
		return fmt.Errorf("updating the status of node %s: %w", st.name, err)
	}
	return nil
}

// applyNodeStatus writes st into s, with now as the heartbeat time, and with Options.RealNodes what
// else a real kubelet reports.
func (a *Agent) applyNodeStatus(s *corev1.NodeStatus, st *nodeState, now metav1.Time) {
	applyNodeStatus(s, st, now)
	if a.opts.RealNodes {
		realNodeStatus(s, st.name, now)
	}
}

// applyNodeStatus writes st into s, with now as the heartbeat time.
func applyNodeStatus(s *corev1.NodeStatus, st *nodeState, now metav1.Time) {
	s.NodeInfo.KernelVersion = st.kernel
	s.NodeInfo.BootID = st.bootID
	s.NodeInfo.OperatingSystem = "linux"
	s.NodeInfo.Architecture = "amd64"
	s.NodeInfo.OSImage = "kmm test agent"
	s.NodeInfo.KubeletVersion = "v0.0.0-kmm-test-agent"
	s.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: st.name}}
	s.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"),
		corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	s.Allocatable = s.Capacity
	cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: reasonReady,
		Message: "the test agent is posting ready status", LastHeartbeatTime: now, LastTransitionTime: st.readySince}
	if !st.ready {
		cond.Status, cond.Reason, cond.Message = corev1.ConditionFalse, reasonNotReady, "the test said the node is not ready"
	}
	setCondition(s, cond)
	for c := range st.pressure {
		pc := corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse, Reason: "KubeletHasNo" + string(c),
			LastHeartbeatTime: now, LastTransitionTime: now}
		if st.pressure[c] {
			pc.Status, pc.Reason = corev1.ConditionTrue, "KubeletHas"+string(c)
		}
		setCondition(s, pc)
	}
}

// setCondition replaces the condition of cond's type in s, or adds it.
func setCondition(s *corev1.NodeStatus, cond corev1.NodeCondition) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == cond.Type {
			if s.Conditions[i].Status == cond.Status && cond.Type != corev1.NodeReady {
				cond.LastTransitionTime = s.Conditions[i].LastTransitionTime
			}
			s.Conditions[i] = cond
			return
		}
	}
	s.Conditions = append(s.Conditions, cond)
}

// nodeMatches says whether s already says what st says (the heartbeat time aside).
func nodeMatches(s *corev1.NodeStatus, st *nodeState) bool {
	if s.NodeInfo.KernelVersion != st.kernel || s.NodeInfo.BootID != st.bootID {
		return false
	}
	want := corev1.ConditionFalse
	if st.ready {
		want = corev1.ConditionTrue
	}
	for _, c := range s.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == want && c.LastTransitionTime.Unix() == st.readySince.Unix()
		}
	}
	return false
}

// nodeLabels is labels plus the well-known labels a kubelet sets, unless labels has them.
func nodeLabels(name string, labels map[string]string) map[string]string {
	out := map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux"}
	for k, v := range labels {
		out[k] = v
	}
	return out
}

// newBootID returns a fresh random boot ID, formatted as the kernel formats one (a UUID).
func newBootID() string { return string(uuid.NewUUID()) }

// now is the current time in whole seconds, as the API stores it.
func (a *Agent) now() metav1.Time { return metav1.NewTime(a.clock.Now()).Rfc3339Copy() }
