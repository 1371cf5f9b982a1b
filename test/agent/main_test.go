package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/poll"
)

// Shared by the tests: a client of the envtest API server and one running agent whose Hold holds
// the pods whose "<namespace>/<name>" is in held.
var (
	restConfig *rest.Config
	k8s        client.Client
	ag         *agent.Agent
	held       sync.Map
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	env, err := envtest.StartWith(envtest.Options{KubeControllers: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	restConfig = env.Config

	ag, err = agent.New(env.Config, agent.Options{Hold: func(pod *corev1.Pod) bool {
		_, ok := held.Load(pod.Namespace + "/" + pod.Name)
		return ok
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k8s = ag.Client()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ag.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	return code
}

var counter atomic.Int64

// unique returns a DNS-label name derived from the test's name.
func unique(t *testing.T, prefix string) string {
	n := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(n) > 40 {
		n = n[:40]
	}
	return fmt.Sprintf("%s-%s-%d", prefix, strings.Trim(n, "-"), counter.Add(1))
}

// namespace creates a namespace for the test (envtest has no namespace controller to delete it).
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unique(t, "ns")}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// addNode adds a node with kernel to the shared agent.
func addNode(t *testing.T, kernel string) string {
	t.Helper()
	name := unique(t, "node")
	if err := ag.AddNode(context.Background(), name, kernel, map[string]string{"test": t.Name()[:min(len(t.Name()), 60)]}); err != nil {
		t.Fatal(err)
	}
	return name
}

// config is a worker Config for module ns/name on kernel from image.
func config(ns, name, kernel, image string) contract.Config {
	return contract.Config{Namespace: ns, Name: name, Config: kmmv1beta1.ModuleConfig{
		KernelVersion: kernel, ContainerImage: image, Version: "v1",
		Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "kmm_ci_" + strings.ReplaceAll(name, "-", "_")},
	}}
}

// workerPod is a worker pod as the operator builds it, reduced to what the agent reads.
func workerPod(t *testing.T, node string, action contract.Action, cfg contract.Config) *corev1.Pod {
	t.Helper()
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("kmm-worker-%s-%s-%s", node, cfg.Name, action),
			Namespace: cfg.Namespace,
			Labels: map[string]string{contract.LabelWorker: "true", contract.LabelNode: node, contract.LabelAction: string(action),
				contract.LabelModuleNamespace: cfg.Namespace, contract.LabelModuleName: cfg.Name},
			Annotations: map[string]string{contract.AnnotationConfig: string(data), contract.AnnotationAttempt: "1"},
		},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: contract.ContainerName, Image: "example.com/kmm/worker:test"}},
		},
	}
}

// create creates obj or fails the test.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls until cond holds for the object at key, failing the test after 5s.
func waitFor[T client.Object](t *testing.T, obj T, what string, cond func(T) bool) T {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	poll.Until(t, 5*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := k8s.Get(context.Background(), key, obj)
		return err == nil && cond(obj), fmt.Sprintf("%T %s: %s (last error %v)", obj, key, what, err)
	})
	return obj
}

// ended waits for pod to end.
func ended(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return waitFor(t, pod, "the pod ends", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
}

// running waits for pod to be Running.
func running(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return waitFor(t, pod, "the pod runs", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
}

// result parses the worker Result of an ended pod.
func result(t *testing.T, pod *corev1.Pod) (contract.Result, *corev1.ContainerStateTerminated) {
	t.Helper()
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == contract.ContainerName && cs.State.Terminated != nil {
			r, err := contract.ParseResult([]byte(cs.State.Terminated.Message))
			if err != nil {
				t.Fatalf("pod %s: %v", pod.Name, err)
			}
			return r, cs.State.Terminated
		}
	}
	t.Fatalf("pod %s has no terminated %s container: %+v", pod.Name, contract.ContainerName, pod.Status)
	return contract.Result{}, nil
}

// getNode reads a Node.
func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

// readyCondition is the node's Ready condition.
func readyCondition(t *testing.T, n *corev1.Node) corev1.NodeCondition {
	t.Helper()
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	t.Fatalf("node %s has no Ready condition: %+v", n.Name, n.Status.Conditions)
	return corev1.NodeCondition{}
}
