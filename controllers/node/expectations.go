package node

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/expectations"
)

// expectationTTL bounds how long the NMC controller trusts its own pod writes over a cache that
// does not show them yet.
const expectationTTL = 30 * time.Second

// podExpectations remember the worker pods the NMC controller created or deleted until its cache
// shows it. Without them a reconcile that runs before the cache caught up (the NMC status write
// comes back before the pod's creation does) decides on the old pods: it creates the pod again
// (a refused POST, and a status write that comes with every planned creation) or deletes a
// finished pod twice.
type podExpectations struct {
	mu      sync.Mutex
	creates map[string]map[string]expectedPod // by node, then pod name (one worker pod per pair)
	// deletes are the worker pods the controller deleted, until the TTL: it never deletes one twice.
	deletes *expectations.Store[types.UID, struct{}]
	// refused are the pods the API server would not create, by node then module key, until a pod
	// of the pair is created: the NMC decision turns them into a failed attempt (fsm.WorkerRejected).
	refused map[string]map[string]fsm.CreateRefusal
}

type expectedPod struct {
	pod *corev1.Pod
	at  time.Time
}

func newPodExpectations() *podExpectations {
	return &podExpectations{creates: map[string]map[string]expectedPod{}, deletes: expectations.New[types.UID, struct{}](expectationTTL),
		refused: map[string]map[string]fsm.CreateRefusal{}}
}

// refusedCreate records a worker pod the API server refused for the pair key on node.
func (e *podExpectations) refusedCreate(node, key string, r fsm.CreateRefusal) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.refused[node] == nil {
		e.refused[node] = map[string]fsm.CreateRefusal{}
	}
	e.refused[node][key] = r
}

// created records a pod the API server accepted.
func (e *podExpectations) created(pod *corev1.Pod, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.creates[pod.Spec.NodeName] == nil {
		e.creates[pod.Spec.NodeName] = map[string]expectedPod{}
	}
	e.creates[pod.Spec.NodeName][pod.Name] = expectedPod{pod: pod, at: now}
	delete(e.refused[pod.Spec.NodeName], pod.Labels[contract.LabelModuleNamespace]+"/"+pod.Labels[contract.LabelModuleName])
	if len(e.refused[pod.Spec.NodeName]) == 0 {
		delete(e.refused, pod.Spec.NodeName)
	}
}

// observed forgets the creation of a pod the cache now shows.
func (e *podExpectations) observed(pod *corev1.Pod) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.creates[pod.Spec.NodeName][pod.Name]; ok && x.pod.UID == pod.UID {
		delete(e.creates[pod.Spec.NodeName], pod.Name)
	}
}

// deleted records a pod whose deletion the API server accepted.
func (e *podExpectations) deleted(uid types.UID, now time.Time) {
	e.deletes.Expect(uid, struct{}{}, now)
}

// deleting says whether the controller already deleted the pod of uid.
func (e *podExpectations) deleting(uid types.UID, now time.Time) bool {
	_, ok := e.deletes.Get(uid, now)
	return ok
}

// fill adds to f the worker pods the controller created on node that its cache does not show yet,
// and forgets the expectations the cache met or that expired.
func (e *podExpectations) fill(f *nodeFacts, node string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, x := range e.creates[node] {
		key := x.pod.Labels[contract.LabelModuleNamespace] + "/" + x.pod.Labels[contract.LabelModuleName]
		switch p := f.workers[key]; {
		case now.Sub(x.at) > expectationTTL || p != nil && p.Name == name:
			delete(e.creates[node], name)
		case p == nil:
			f.workers[key] = x.pod
		}
	}
	if len(e.creates[node]) == 0 {
		delete(e.creates, node)
	}
	for key, r := range e.refused[node] {
		f.refused[key] = r
	}
	e.deletes.Prune(now)
}
