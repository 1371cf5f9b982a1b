package controllers_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestNodePressureNeitherBlocksALoadNorUnloads: nodes under disk, PID and memory pressure (the
// conditions and their NoSchedule taints; the agent admits pods as the kubelet's eviction manager
// does) get the module loaded, keep it through an image change that reloads it under pressure, and
// never see an unload pod. Every pod kmm creates for a Module carries its tolerations (worker pods,
// and the device plugin pods of a second, device-plugin-only Module), and the device plugin pods
// honour devicePlugin.automountServiceAccountToken. It fails before worker pods
// were critical (system-node-critical): the kubelet refuses them on a node under disk or PID
// pressure (Evicted), and the pair backs off.
func TestNodePressureNeitherBlocksALoadNorUnloads(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 3, testbed.KernelA)
	ctx := context.Background()
	for i, cond := range []corev1.NodeConditionType{corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeMemoryPressure} {
		if err := node.SetPressure(ctx, tb.Nodes[i], cond, true); err != nil {
			t.Fatal(err)
		}
	}
	toleration := corev1.Toleration{Key: "example.com/dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	unloads := watchKMMPods(t, tb.NS, toleration)
	m := tb.Module("nic")
	m.Spec.Tolerations = []corev1.Toleration{toleration}
	tb.Create(m)
	dp := tb.Module("dp") // device plugin only: its DaemonSet runs on every selected node
	dp.Spec.ModuleLoader = nil
	dp.Spec.Tolerations = []corev1.Toleration{toleration}
	dp.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/dp:1"},
		AutomountServiceAccountToken: ptr.To(false)}
	tb.Create(dp)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)

	// Every node under disk pressure now, and an image change reloads it there (one reload pod per
	// node: the Module has no device plugin, so no unload pod is expected at all).
	for _, n := range tb.Nodes {
		if err := node.SetPressure(ctx, n, corev1.NodeDiskPressure, true); err != nil {
			t.Fatal(err)
		}
	}
	setImage(t, tb.NS, "nic", "reg.example.com/nic:a2")
	tb.WaitLoaded("nic", "reg.example.com/nic:a2", tb.Nodes...)

	kinds, problems := unloads.checked()
	if kinds["worker"] < 6 || kinds["device plugin"] < 3 {
		t.Errorf("the watch saw %v pods, want at least 6 worker and 3 device plugin pods", kinds)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if u := unloads.list(); len(u) > 0 {
		t.Fatalf("unload pods under node pressure: %v", u)
	}
}

// kmmPods watches the pods kmm creates in a namespace: the unload worker pods, and every pod that
// lacks the Module's toleration or (a device plugin pod) mounts its service account token.
type kmmPods struct {
	mu       sync.Mutex
	unloads  []string
	problems []string
	kinds    map[string]int
}

func watchKMMPods(t *testing.T, ns string, toleration corev1.Toleration) *kmmPods {
	u := &kmmPods{kinds: map[string]int{}}
	testbed.Watch(t, cluster, &corev1.PodList{}, func(ev watch.EventType, p *corev1.Pod) {
		if ev != watch.Added {
			return
		}
		u.mu.Lock()
		defer u.mu.Unlock()
		kind := "device plugin"
		if p.Labels[contract.LabelWorker] == "true" {
			kind = "worker"
		}
		u.kinds[kind]++
		if p.Labels[contract.LabelAction] == string(contract.ActionUnload) {
			u.unloads = append(u.unloads, fmt.Sprintf("%s at %s", p.Name, time.Now().Format(time.StampMilli)))
		}
		if !slices.ContainsFunc(p.Spec.Tolerations, func(t corev1.Toleration) bool { return t == toleration }) {
			u.problems = append(u.problems, fmt.Sprintf("%s pod %s lacks the Module's toleration: %v", kind, p.Name, p.Spec.Tolerations))
		}
		if kind == "device plugin" && (p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken) {
			u.problems = append(u.problems, fmt.Sprintf("device plugin pod %s mounts the service account token: automountServiceAccountToken=false not honoured", p.Name))
		}
	}, client.InNamespace(ns))
	return u
}

func (u *kmmPods) list() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.unloads)
}

func (u *kmmPods) checked() (map[string]int, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.kinds), slices.Clone(u.problems)
}
