//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kmm-project/kmm/contract"
)

// podEvent is one event of a pod watch, as the API server ordered them.
type podEvent struct {
	typ watch.EventType
	pod *corev1.Pod
	at  time.Time
}

// workerRun is one worker pod as the watch saw it.
type workerRun struct {
	name    string
	action  string
	last    *corev1.Pod // its last state
	deleted bool
}

func (w workerRun) String() string {
	return fmt.Sprintf("%s %s: %s (deleted %v)", w.action, w.name, w.last.Status.Phase, w.deleted)
}

// podRecorder keeps every event of a watch on the pods of a namespace and checks, at every
// event, that no (node, Module) pair has more than one worker pod (SPEC §4, invariant 3).
type podRecorder struct {
	mu     sync.Mutex
	events []podEvent
	live   map[types.UID]*corev1.Pod
	issues []string
}

// recordPods lists the pods of namespace and watches them from there until ctx ends (resuming a
// watch the API server closes); wg counts the goroutine.
func recordPods(ctx context.Context, cs kubernetes.Interface, namespace string, wg *sync.WaitGroup) (*podRecorder, error) {
	r := &podRecorder{live: map[types.UID]*corev1.Pod{}}
	list, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		r.observe(watch.Added, &list.Items[i])
	}
	events, err := watchPods(ctx, cs, namespace, list.ResourceVersion, wg)
	if err != nil {
		return nil, err
	}
	wg.Go(func() {
		for ev := range events {
			if pod, ok := ev.Object.(*corev1.Pod); ok {
				r.observe(ev.Type, pod)
			} else if ev.Type == watch.Error {
				r.issue(fmt.Sprintf("the pod watch failed: %v", ev.Object))
			}
		}
	})
	return r, nil
}

// watchPods watches the pods of namespace from resourceVersion, resuming after the API server
// closes a watch, until ctx ends; the channel closes then.
func watchPods(ctx context.Context, cs kubernetes.Interface, namespace, resourceVersion string, wg *sync.WaitGroup) (<-chan watch.Event, error) {
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, resourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Pods(namespace).Watch(ctx, o)
		},
	})
	if err != nil {
		return nil, err
	}
	out := make(chan watch.Event)
	wg.Go(func() {
		defer close(out)
		defer rw.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					return
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	})
	return out, nil
}

func (r *podRecorder) observe(typ watch.EventType, pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, podEvent{typ: typ, pod: pod, at: time.Now()})
	if typ == watch.Deleted {
		delete(r.live, pod.UID)
		return
	}
	r.live[pod.UID] = pod
	perPair := map[string][]string{}
	for _, p := range r.live {
		if p.Labels[contract.LabelWorker] == "true" {
			key := p.Spec.NodeName + " " + p.Labels[contract.LabelModuleNamespace] + "/" + p.Labels[contract.LabelModuleName]
			perPair[key] = append(perPair[key], p.Name+" ("+p.Labels[contract.LabelAction]+")")
		}
	}
	for pair, pods := range perPair {
		if len(pods) > 1 {
			sort.Strings(pods)
			r.issues = append(r.issues, fmt.Sprintf("%d worker pods of the pair %s at once: %v", len(pods), pair, pods))
		}
	}
}

func (r *podRecorder) issue(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.issues = append(r.issues, s)
}

// problems are the violations and watch failures seen so far.
func (r *podRecorder) problems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.issues...)
}

// mark is the position of the next event, for since.
func (r *podRecorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// since returns the events from mark on.
func (r *podRecorder) since(mark int) []podEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]podEvent(nil), r.events[mark:]...)
}

// workerRuns returns the worker pods of a Module of the namespace, in the order they appeared.
func (r *podRecorder) workerRuns(module string) []workerRun {
	r.mu.Lock()
	defer r.mu.Unlock()
	var runs []workerRun
	index := map[types.UID]int{}
	for _, e := range r.events {
		if !isWorker(e.pod, module) {
			continue
		}
		i, ok := index[e.pod.UID]
		if !ok {
			i = len(runs)
			index[e.pod.UID] = i
			runs = append(runs, workerRun{name: e.pod.Name, action: e.pod.Labels[contract.LabelAction]})
		}
		runs[i].last = e.pod
		runs[i].deleted = runs[i].deleted || e.typ == watch.Deleted
	}
	return runs
}

// describeEvents lists events one a line, for failure messages.
func describeEvents(events []podEvent) string {
	var b strings.Builder
	for i, e := range events {
		p := e.pod
		fmt.Fprintf(&b, "%3d %s %-8s %s %s action=%s\n", i, e.at.Format("15:04:05.000"), e.typ, p.Name, p.Status.Phase, p.Labels[contract.LabelAction])
	}
	return b.String()
}

// followOperatorLogs copies the log of every operator container that starts, through the API
// server, to logDir/operator-<pod>.log until ctx ends: the kubelet removes a deleted pod's logs,
// and a failed run keeps logDir.
func followOperatorLogs(ctx context.Context, cs kubernetes.Interface, logDir string, wg *sync.WaitGroup) error {
	list, err := cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	events, err := watchPods(ctx, cs, operatorNamespace, list.ResourceVersion, wg)
	if err != nil {
		return err
	}
	following := map[string]bool{}
	wg.Go(func() {
		for ev := range events {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			for _, st := range pod.Status.ContainerStatuses {
				key := fmt.Sprintf("%s/%d", pod.Name, st.RestartCount)
				if st.Name != "manager" || (st.State.Running == nil && st.State.Terminated == nil) || following[key] {
					continue
				}
				following[key] = true
				wg.Go(func() { copyLog(ctx, cs, pod.Name, filepath.Join(logDir, "operator-"+pod.Name+".log")) })
			}
		}
	})
	return nil
}

// copyLog appends the manager container's log, followed, to file.
func copyLog(ctx context.Context, cs kubernetes.Interface, pod, file string) {
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	rc, err := cs.CoreV1().Pods(operatorNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "manager", Follow: true}).Stream(ctx)
	if err != nil {
		_, _ = fmt.Fprintf(f, "e2e: reading the log: %v\n", err)
		return
	}
	defer func() { _ = rc.Close() }()
	_, _ = io.Copy(f, rc)
}
