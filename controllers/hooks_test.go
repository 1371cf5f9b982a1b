package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestHooksFailBackOffAndRecover is issue 40's item 5 on the testbed: a Module with a postLoad and
// a preUnload hook. A failing postLoad hook leaves the module loaded (and recorded so), the pair in
// LoadBackOff with PostLoadHookFailed, the hook's message and one Warning Event, and no ready
// label; once the hook succeeds, the retry after the back-off makes it Loaded. A failing preUnload
// hook keeps the module loaded (the worker never runs) in UnloadBackOff with PreUnloadHookFailed;
// once it succeeds, the unload goes through and the Module is gone.
func TestHooksFailBackOffAndRecover(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	var postLoadExit, preUnloadExit atomic.Int32
	postLoadExit.Store(3)
	node.SetOutcome(func(in agent.RunInput) agent.Verdict {
		v := agent.DefaultOutcome(in)
		if in.Pod.Namespace != tb.NS {
			return v
		}
		if in.Action == contract.ActionLoad {
			v.HookExit, v.HookMessage = postLoadExit.Load(), "no device 0000:3b:00.0 bound"
		} else {
			v.HookExit, v.HookMessage = preUnloadExit.Load(), "echo: write error: Device or resource busy"
		}
		return v
	})
	t.Cleanup(func() { node.SetOutcome(nil) })

	m := tb.Module("nic")
	hook := func(arg string) *kmmv1beta1.ModuleHook {
		return &kmmv1beta1.ModuleHook{Image: "reg.example.com/nic-hooks:1", Args: []string{arg},
			Privileged: true, HostPaths: []string{"/sys/bus/pci"}}
	}
	m.Spec.ModuleLoader.Hooks = &kmmv1beta1.ModuleHooks{PostLoad: hook("bind"), PreUnload: hook("unbind")}
	tb.Create(m)

	// postLoad fails: backed off, module loaded and recorded, not ready.
	st := waitPair(t, n, tb.NS, "nic", func(st *kmmv1beta1.NodeModuleStatus) bool {
		return st.State == kmmv1beta1.StateLoadBackOff && st.Reason == fsm.ReasonPostLoadHookFailed
	})
	if !strings.Contains(st.Message, "post-load hook exited 3: no device 0000:3b:00.0 bound") || st.Config == nil {
		t.Errorf("status after a failed postLoad hook: %s, message %q; want the hook's exit and message, the config recorded", testbed.Describe(st), st.Message)
	}
	if _, ok := node.Loaded(n)[tb.NS+"/nic"]; !ok {
		t.Error("the module is not loaded: the worker ran before the hook")
	}
	if _, ok := cluster.Node(t, n).Labels[kmmv1beta1.ReadyLabel(tb.NS, "nic")]; ok {
		t.Error("the ready label is on the node while the postLoad hook fails")
	}
	waitWarning(t, tb.NS, fsm.ReasonPostLoadHookFailed)

	// Fixed: the retry after the back-off loads (again) and runs the hook; Loaded.
	postLoadExit.Store(0)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)
	if st := cluster.PairStatus(n, tb.NS, "nic"); st.Attempts != 0 {
		t.Errorf("attempts %d after the hook succeeded", st.Attempts)
	}

	// preUnload fails: the Module deleted, the module stays loaded, backed off.
	preUnloadExit.Store(1)
	if err := k8s.Delete(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	st = waitPair(t, n, tb.NS, "nic", func(st *kmmv1beta1.NodeModuleStatus) bool {
		return st.State == kmmv1beta1.StateUnloadBackOff && st.Reason == fsm.ReasonPreUnloadHookFailed
	})
	if !strings.Contains(st.Message, "pre-unload hook exited 1: echo: write error: Device or resource busy") || st.Config == nil {
		t.Errorf("status after a failed preUnload hook: %s, message %q", testbed.Describe(st), st.Message)
	}
	if _, ok := node.Loaded(n)[tb.NS+"/nic"]; !ok {
		t.Error("the module was unloaded although its preUnload hook failed")
	}
	assertUnloadPodRunsTheHookFirst(t, tb.NS, n)
	waitWarning(t, tb.NS, fsm.ReasonPreUnloadHookFailed)

	// Fixed: the unload goes through after the back-off.
	preUnloadExit.Store(0)
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		_, loaded := node.Loaded(n)[tb.NS+"/nic"]
		return !loaded && cluster.PairStatus(n, tb.NS, "nic") == nil, "the module unloaded and its entry gone: " + testbed.Describe(cluster.PairStatus(n, tb.NS, "nic"))
	})
}

func waitPair(t *testing.T, n, ns, name string, ok func(*kmmv1beta1.NodeModuleStatus) bool) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, ns, name)
		return st != nil && ok(st), testbed.Describe(st)
	})
	return cluster.PairStatus(n, ns, name)
}

// waitWarning waits for a Warning Event with reason in ns.
func waitWarning(t *testing.T, ns, reason string) {
	t.Helper()
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		evs := &eventsv1.EventList{}
		_ = k8s.List(context.Background(), evs, client.InNamespace(ns))
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning {
				return true, ""
			}
		}
		return false, fmt.Sprintf("a Warning Event %s among %d events", reason, len(evs.Items))
	})
}

// assertUnloadPodRunsTheHookFirst checks the failed unload pod kept for inspection: its init
// container is the preUnload hook, the worker after it never started.
func assertUnloadPodRunsTheHookFirst(t *testing.T, ns, n string) {
	t.Helper()
	for _, p := range workerPodsOn(t, n) {
		if p.Namespace != ns || p.Labels[contract.LabelAction] != string(contract.ActionUnload) {
			continue
		}
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != contract.PreUnloadHookContainer || p.Spec.InitContainers[0].Args[0] != "unbind" {
			t.Errorf("the unload pod's init containers: %+v", p.Spec.InitContainers)
		}
		return
	}
	t.Error("no unload pod kept after its hook failed")
}
