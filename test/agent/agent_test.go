package agent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
)

const kernel = "6.1.0-kmm.x86_64"

func TestAddNodeSetsStatus(t *testing.T) {
	before := time.Now().Truncate(time.Second)
	name := addNode(t, kernel)
	n := getNode(t, name)
	if n.Status.NodeInfo.KernelVersion != kernel {
		t.Errorf("kernelVersion = %q, want %q", n.Status.NodeInfo.KernelVersion, kernel)
	}
	if n.Status.NodeInfo.BootID == "" || n.Status.NodeInfo.BootID != ag.BootID(name) {
		t.Errorf("bootID = %q, agent says %q", n.Status.NodeInfo.BootID, ag.BootID(name))
	}
	c := readyCondition(t, n)
	if c.Status != corev1.ConditionTrue || c.LastTransitionTime.Time.Before(before) || c.LastHeartbeatTime.IsZero() {
		t.Errorf("Ready condition = %+v, want True since %v", c, before)
	}
	if n.Labels["test"] == "" || n.Labels[corev1.LabelHostname] != name {
		t.Errorf("labels = %v", n.Labels)
	}
	if got := ag.Loaded(name); len(got) != 0 {
		t.Errorf("a new node has modules loaded: %v", got)
	}
	if err := ag.AddNode(context.Background(), name, kernel, nil); err == nil {
		t.Error("adding a node twice succeeded")
	}
}

func TestLoadThenUnload(t *testing.T) {
	ns, node := namespace(t), addNode(t, kernel)
	cfg := config(ns, "mod-a", kernel, "registry.example/kmod-a:v1")
	load := workerPod(t, node, contract.ActionLoad, cfg)
	create(t, load)
	load = ended(t, load)
	if load.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("load pod phase = %s", load.Status.Phase)
	}
	r, term := result(t, load)
	want := contract.Result{Action: contract.ActionLoad, Namespace: ns, Name: "mod-a", KernelModule: "kmm_ci_mod_a", Version: "v1",
		Kernel: kernel, BootID: getNode(t, node).Status.NodeInfo.BootID, ImageDigest: agent.ImageDigest(cfg.Config.ContainerImage),
		Outcome: contract.OutcomeSucceeded}
	if r != want {
		t.Errorf("result = %+v\nwant %+v", r, want)
	}
	if term.ExitCode != 0 || term.Reason != "Completed" || term.FinishedAt.IsZero() {
		t.Errorf("terminated state = %+v", term)
	}
	if got := ag.Loaded(node); len(got) != 1 || got[ns+"/mod-a"].ContainerImage != cfg.Config.ContainerImage {
		t.Errorf("loaded = %v", got)
	}

	unload := workerPod(t, node, contract.ActionUnload, cfg)
	create(t, unload)
	if unload = ended(t, unload); unload.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("unload pod phase = %s", unload.Status.Phase)
	}
	if r, _ := result(t, unload); r.Action != contract.ActionUnload || r.Outcome != contract.OutcomeSucceeded {
		t.Errorf("unload result = %+v", r)
	}
	if got := ag.Loaded(node); len(got) != 0 {
		t.Errorf("loaded after unload = %v", got)
	}
	if n := ag.RunCount(node, ns+"/mod-a"); n != 2 {
		t.Errorf("RunCount = %d, want 2", n)
	}
}

func TestLoadFailures(t *testing.T) {
	ns, node := namespace(t), addNode(t, kernel)
	for _, tc := range []struct {
		name, kernel, image string
		reason              contract.Reason
	}{
		{"broken", kernel, "registry.example/broken:v1", contract.ReasonImagePull},
		{"missing", kernel, "registry.example/doesnotexist:v1", contract.ReasonImagePull},
		{"other-kernel", "5.14.0-old", "registry.example/kmod:v1", contract.ReasonNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := workerPod(t, node, contract.ActionLoad, config(ns, tc.name, tc.kernel, tc.image))
			create(t, pod)
			pod = ended(t, pod)
			r, term := result(t, pod)
			if pod.Status.Phase != corev1.PodFailed || r.Outcome != contract.OutcomeFailed || r.Reason != tc.reason || r.Message == "" {
				t.Errorf("phase %s, result %+v, want Failed with reason %s", pod.Status.Phase, r, tc.reason)
			}
			if term.ExitCode != 1 || term.Reason != "Error" {
				t.Errorf("terminated state = %+v", term)
			}
			if (r.ImageDigest == "") != (tc.reason == contract.ReasonImagePull) {
				t.Errorf("image digest %q with reason %s", r.ImageDigest, r.Reason)
			}
		})
	}
	if got := ag.Loaded(node); len(got) != 0 {
		t.Errorf("failed loads left modules loaded: %v", got)
	}
}

func TestMalformedConfigFails(t *testing.T) {
	ns, node := namespace(t), addNode(t, kernel)
	pod := workerPod(t, node, contract.ActionLoad, config(ns, "bad", kernel, "registry.example/kmod:v1"))
	pod.Annotations[contract.AnnotationConfig] = `{"namespace": 3}`
	create(t, pod)
	pod = ended(t, pod)
	if r, _ := result(t, pod); pod.Status.Phase != corev1.PodFailed || r.Reason != contract.ReasonInvalidConfig || r.Name != "bad" {
		t.Errorf("phase %s, result %+v", pod.Status.Phase, r)
	}
}

func TestRebootFailsRunningPodAndClearsModules(t *testing.T) {
	ctx := context.Background()
	ns, node := namespace(t), addNode(t, kernel)
	loaded := workerPod(t, node, contract.ActionLoad, config(ns, "loaded", kernel, "registry.example/kmod:v1"))
	create(t, loaded)
	ended(t, loaded)
	if len(ag.Loaded(node)) != 1 {
		t.Fatalf("loaded = %v", ag.Loaded(node))
	}

	pod := workerPod(t, node, contract.ActionLoad, config(ns, "inflight", kernel, "registry.example/kmod:v1"))
	held.Store(ns+"/"+pod.Name, true)
	t.Cleanup(func() { held.Delete(ns + "/" + pod.Name) })
	create(t, pod)
	pod = running(t, pod)
	if cs := pod.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running == nil || pod.Status.StartTime == nil {
		t.Errorf("a running pod's status = %+v", pod.Status)
	}

	oldNode := getNode(t, node)
	oldBoot, oldReady := oldNode.Status.NodeInfo.BootID, readyCondition(t, oldNode)
	if err := ag.Reboot(ctx, node); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, node)
	if n.Status.NodeInfo.BootID == oldBoot || n.Status.NodeInfo.BootID != ag.BootID(node) {
		t.Errorf("bootID %q after reboot, was %q", n.Status.NodeInfo.BootID, oldBoot)
	}
	if c := readyCondition(t, n); c.Status != corev1.ConditionTrue || c.LastTransitionTime.Before(&oldReady.LastTransitionTime) {
		t.Errorf("Ready after reboot = %+v, before %+v", c, oldReady)
	}
	pod = ended(t, pod)
	r, _ := result(t, pod)
	if pod.Status.Phase != corev1.PodFailed || r.Reason != contract.ReasonOther || r.BootID != oldBoot ||
		!strings.Contains(r.Message, "rebooted") || r.Name != "inflight" {
		t.Errorf("phase %s, result %+v; want Failed, Other, rebooted, bootID %s", pod.Status.Phase, r, oldBoot)
	}
	if got := ag.Loaded(node); len(got) != 0 {
		t.Errorf("loaded after reboot = %v", got)
	}

	// A pod created after the reboot runs with the new boot ID.
	again := workerPod(t, node, contract.ActionLoad, config(ns, "again", kernel, "registry.example/kmod:v1"))
	create(t, again)
	if r, _ := result(t, ended(t, again)); r.Outcome != contract.OutcomeSucceeded || r.BootID != n.Status.NodeInfo.BootID {
		t.Errorf("result after reboot = %+v, want success with bootID %s", r, n.Status.NodeInfo.BootID)
	}
}

func TestSetKernelReboots(t *testing.T) {
	ns, node := namespace(t), addNode(t, kernel)
	oldBoot := ag.BootID(node)
	const newKernel = "6.2.0-kmm.x86_64"
	if err := ag.SetKernel(context.Background(), node, newKernel); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, node)
	if n.Status.NodeInfo.KernelVersion != newKernel || n.Status.NodeInfo.BootID == oldBoot {
		t.Errorf("after SetKernel: kernel %q bootID %q (was %q)", n.Status.NodeInfo.KernelVersion, n.Status.NodeInfo.BootID, oldBoot)
	}
	// A config for the old kernel no longer loads; one for the new kernel does.
	old := workerPod(t, node, contract.ActionLoad, config(ns, "old", kernel, "registry.example/kmod:v1"))
	cur := workerPod(t, node, contract.ActionLoad, config(ns, "new", newKernel, "registry.example/kmod:v1"))
	create(t, old)
	create(t, cur)
	if r, _ := result(t, ended(t, old)); r.Reason != contract.ReasonNotFound {
		t.Errorf("old-kernel load result = %+v, want NotFound", r)
	}
	if r, _ := result(t, ended(t, cur)); r.Outcome != contract.OutcomeSucceeded || r.Kernel != newKernel {
		t.Errorf("new-kernel load result = %+v", r)
	}
}

func TestNotReadyNodeRunsNothing(t *testing.T) {
	ctx := context.Background()
	ns, node := namespace(t), addNode(t, kernel)
	if err := ag.SetReady(ctx, node, false); err != nil {
		t.Fatal(err)
	}
	if c := readyCondition(t, getNode(t, node)); c.Status != corev1.ConditionFalse {
		t.Errorf("Ready = %+v after SetReady(false)", c)
	}
	pod := workerPod(t, node, contract.ActionLoad, config(ns, "waits", kernel, "registry.example/kmod:v1"))
	create(t, pod)
	time.Sleep(300 * time.Millisecond) // several agent passes
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending || ag.RunCount(node, ns+"/waits") != 0 {
		t.Fatalf("a pod on a NotReady node: phase %s, runs %d", pod.Status.Phase, ag.RunCount(node, ns+"/waits"))
	}
	if err := ag.SetReady(ctx, node, true); err != nil {
		t.Fatal(err)
	}
	if c := readyCondition(t, getNode(t, node)); c.Status != corev1.ConditionTrue {
		t.Errorf("Ready = %+v after SetReady(true)", c)
	}
	if pod = ended(t, pod); pod.Status.Phase != corev1.PodSucceeded {
		t.Errorf("phase %s once Ready", pod.Status.Phase)
	}
}

func TestNodeStatusIsReasserted(t *testing.T) {
	ctx := context.Background()
	node := addNode(t, kernel)
	n := getNode(t, node)
	n.Status.NodeInfo.KernelVersion = "changed-behind-the-agents-back"
	for i := range n.Status.Conditions {
		n.Status.Conditions[i].Status = corev1.ConditionUnknown
	}
	if err := k8s.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, "the agent restores the status", func(n *corev1.Node) bool {
		return n.Status.NodeInfo.KernelVersion == kernel && readyCondition(t, n).Status == corev1.ConditionTrue
	})
}

// TestAPIServerPodDeletion pins down what the API server does with pod deletion when no kubelet
// runs, which is why the agent confirms deletions.
func TestAPIServerPodDeletion(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	cfg := config(ns, "x", kernel, "registry.example/kmod:v1")

	unbound := workerPod(t, "", contract.ActionLoad, cfg)
	unbound.Name = "unbound"
	create(t, unbound)
	if err := k8s.Delete(ctx, unbound); err != nil {
		t.Fatal(err)
	}
	gone(t, unbound, "a pod bound to no node is deleted at once")

	// Bound to a node nobody runs: it stays Terminating until deleted with grace period 0.
	bound := workerPod(t, "no-kubelet-here", contract.ActionLoad, cfg)
	create(t, bound)
	if err := k8s.Delete(ctx, bound); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(bound), bound); err != nil || bound.DeletionTimestamp == nil {
		t.Fatalf("a bound pod after delete: err %v, deletionTimestamp %v", err, bound.DeletionTimestamp)
	}
	if bound.Status.Phase != corev1.PodPending {
		t.Errorf("the agent touched a pod on a node it does not manage: %+v", bound.Status)
	}
	if err := k8s.Delete(ctx, bound, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	gone(t, bound, "a bound pod is deleted with grace period 0")

	// Bound, but ended: deleted at once.
	ended := workerPod(t, "no-kubelet-here", contract.ActionUnload, cfg)
	create(t, ended)
	setFailed(t, ended)
	if err := k8s.Delete(ctx, ended); err != nil {
		t.Fatal(err)
	}
	gone(t, ended, "an ended bound pod is deleted at once")
}

// TestAPIServerPodPhase pins down that the API server does not keep an ended pod ended: only the
// container state is guarded (terminated may not become running with restartPolicy Never), the
// phase may go from Failed back to Running. Whoever writes pod status must check the phase itself.
func TestAPIServerPodPhase(t *testing.T) {
	ctx := context.Background()
	pod := workerPod(t, "no-kubelet-here", contract.ActionLoad, config(namespace(t), "x", kernel, "registry.example/kmod:v1"))
	create(t, pod)
	setFailed(t, pod)
	running := pod.DeepCopy()
	running.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	if err := k8s.Status().Update(ctx, running); !apierrors.IsInvalid(err) {
		t.Errorf("a terminated container back to running: got %v, want Invalid", err)
	}
	pod.Status.Phase = corev1.PodRunning
	if err := k8s.Status().Update(ctx, pod); err != nil {
		t.Errorf("an ended pod's phase back to Running: %v (the API server now guards the phase)", err)
	}
	if err := k8s.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
}

// setFailed gives pod, bound to no managed node, a Failed status with a terminated container.
func setFailed(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	pod.Status.Phase = corev1.PodFailed
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: contract.ContainerName,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}
	if err := k8s.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

func TestDeletedRunningPodGoesAway(t *testing.T) {
	ctx := context.Background()
	ns, node := namespace(t), addNode(t, kernel)
	pod := workerPod(t, node, contract.ActionLoad, config(ns, "deleted", kernel, "registry.example/kmod:v1"))
	held.Store(ns+"/"+pod.Name, true)
	t.Cleanup(func() { held.Delete(ns + "/" + pod.Name) })
	create(t, pod)
	running(t, pod)
	if err := k8s.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	gone(t, pod, "the agent confirms the deletion")
	runs := ag.Runs()
	var found bool
	for _, r := range runs {
		if r.Node == node && r.Pod == pod.Name {
			found = r.Result.Outcome == contract.OutcomeFailed && strings.Contains(r.Result.Message, "deleted")
		}
	}
	if !found {
		t.Errorf("no Failed run recorded for the deleted pod in %+v", runs)
	}
}

func TestDeletionWaitsForReadyNode(t *testing.T) {
	ctx := context.Background()
	ns, node := namespace(t), addNode(t, kernel)
	pod := workerPod(t, node, contract.ActionLoad, config(ns, "stuck", kernel, "registry.example/kmod:v1"))
	if err := ag.SetReady(ctx, node, false); err != nil {
		t.Fatal(err)
	}
	create(t, pod)
	if err := k8s.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil || pod.DeletionTimestamp == nil {
		t.Fatalf("a pod deleted on a NotReady node: err %v, deletionTimestamp %v", err, pod.DeletionTimestamp)
	}
	if err := ag.SetReady(ctx, node, true); err != nil {
		t.Fatal(err)
	}
	gone(t, pod, "the deletion is confirmed once the node is Ready")
}

func TestOwnAgentWithCustomOutcomeAndDelay(t *testing.T) {
	busy := func(in agent.RunInput) agent.Verdict {
		if in.Action == contract.ActionUnload {
			return agent.Failed(contract.ReasonBusy, "modprobe: FATAL: Module "+in.Config.Config.Modprobe.ModuleName+" is in use.")
		}
		return agent.DefaultOutcome(in)
	}
	own, ns, node := startOwnAgent(t, agent.Options{Outcome: busy, RunDelay: 200 * time.Millisecond})
	pod := workerPod(t, node, contract.ActionUnload, config(ns, "busy", kernel, "registry.example/kmod:v1"))
	start := time.Now()
	create(t, pod)
	running(t, pod) // RunDelay shows the pod Running first
	pod = ended(t, pod)
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("the pod ended after %v, before RunDelay", d)
	}
	if r, _ := result(t, pod); r.Reason != contract.ReasonBusy {
		t.Errorf("result = %+v, want Busy", r)
	}
	if ag.RunCount(node, ns+"/busy") != 0 || own.RunCount(node, ns+"/busy") != 1 {
		t.Errorf("runs: shared agent %d, own agent %d", ag.RunCount(node, ns+"/busy"), own.RunCount(node, ns+"/busy"))
	}
}

// gone waits for obj to be deleted.
func gone(t *testing.T, obj client.Object, what string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("%s: %s/%s still exists", what, obj.GetNamespace(), obj.GetName())
	}
}

// TestReload: a reload pod replaces the loaded config in one run; a reload whose load half fails
// (config for another kernel) leaves nothing loaded and says so; one whose image cannot be pulled
// leaves the previous config loaded.
func TestReload(t *testing.T) {
	ns, node := namespace(t), addNode(t, kernel)
	load := workerPod(t, node, contract.ActionLoad, config(ns, "mod-r", kernel, "registry.example/kmod-r:v1"))
	create(t, load)
	ended(t, load)
	run := func(name, image, cfgKernel string) contract.Result {
		t.Helper()
		next := config(ns, "mod-r", cfgKernel, image)
		prev := ag.Loaded(node)[ns+"/mod-r"]
		next.Previous = &prev
		pod := workerPod(t, node, contract.ActionReload, next)
		pod.Name = name
		create(t, pod)
		r, _ := result(t, ended(t, pod))
		return r
	}
	if r := run("reload-ok", "registry.example/kmod-r:v2", kernel); r.Action != contract.ActionReload || r.Outcome != contract.OutcomeSucceeded || r.FailedStep != "" {
		t.Errorf("reload result = %+v", r)
	}
	if got := ag.Loaded(node)[ns+"/mod-r"]; got.ContainerImage != "registry.example/kmod-r:v2" {
		t.Errorf("loaded after the reload: %v", ag.Loaded(node))
	}
	if r := run("reload-pull", "registry.example/broken:v3", kernel); r.Reason != contract.ReasonImagePull || r.FailedStep != contract.StepUnload {
		t.Errorf("reload of an image that cannot be pulled: %+v", r)
	}
	if got := ag.Loaded(node)[ns+"/mod-r"]; got.ContainerImage != "registry.example/kmod-r:v2" {
		t.Errorf("a reload failing before its unload changed what is loaded: %v", ag.Loaded(node))
	}
	if r := run("reload-load", "registry.example/kmod-r:v4", kernel); r.Outcome != contract.OutcomeSucceeded {
		t.Fatalf("reload: %+v", r)
	}
	next := config(ns, "mod-r", kernel, "registry.example/kmod-r:v5")
	next.Config.KernelVersion, next.Previous = "5.14.0-old", nil
	prev := ag.Loaded(node)[ns+"/mod-r"]
	prev.KernelVersion = "5.14.0-old"
	next.Previous = &prev
	pod := workerPod(t, node, contract.ActionReload, next)
	pod.Name = "reload-other-kernel"
	create(t, pod)
	if r, _ := result(t, ended(t, pod)); r.Reason != contract.ReasonNotFound || r.FailedStep != contract.StepLoad {
		t.Errorf("reload whose load half fails: %+v", r)
	}
	if got := ag.Loaded(node); len(got) != 0 {
		t.Errorf("a reload whose load half failed should leave nothing loaded: %v", got)
	}
}

// TestStopDelayKeepsADeletedPodRunning: with StopDelay, a deleted pod that is not a worker pod (a
// device plugin) stays, Running, for StopDelay after the agent saw its deletion, then goes; without
// it (the shared agent) it goes at once.
func TestStopDelayKeepsADeletedPodRunning(t *testing.T) {
	ctx := context.Background()
	const stop = 700 * time.Millisecond
	_, ns, node := startOwnAgent(t, agent.Options{StopDelay: stop})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "device-plugin"},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "dp", Image: "registry.example/dp:v1"}}},
	}
	create(t, pod)
	running(t, pod)
	if err := k8s.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	time.Sleep(stop / 2)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("%v after its deletion, within StopDelay: err %v, phase %q; want the pod still Running", stop/2, err, pod.Status.Phase)
	}
	gone(t, pod, "the deletion is confirmed after StopDelay")
	if d := time.Since(deleted); d < stop {
		t.Errorf("the pod went %v after its deletion, before StopDelay %v", d, stop)
	}
}

// startOwnAgent starts an agent of the test's own with opts (beside the shared one), stopped when
// the test ends, with one node of its own; it returns the agent, a namespace and the node.
func startOwnAgent(t *testing.T, opts agent.Options) (*agent.Agent, string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	own, err := agent.New(restConfig, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- own.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	ns, node := namespace(t), unique(t, "own")
	if err := own.AddNode(ctx, node, kernel, nil); err != nil {
		t.Fatal(err)
	}
	return own, ns, node
}

// TestRunDelayForDelaysEachPodOnItsOwn: a pod given a long run time does not hold back one given
// none on the same node (issue 41, pull times): the short one ends while the long one still runs,
// and the long one ends no sooner than its time.
func TestRunDelayForDelaysEachPodOnItsOwn(t *testing.T) {
	const slow = 1500 * time.Millisecond
	delay := func(p *corev1.Pod) time.Duration {
		if strings.Contains(p.Name, "slow") {
			return slow
		}
		return 0
	}
	_, ns, node := startOwnAgent(t, agent.Options{RunDelayFor: delay, Workers: 4})
	long := workerPod(t, node, contract.ActionLoad, config(ns, "slow", kernel, "registry.example/kmod-slow:v1"))
	long.Name = "slow-" + long.Name
	short := workerPod(t, node, contract.ActionLoad, config(ns, "fast", kernel, "registry.example/kmod-fast:v1"))
	start := time.Now()
	create(t, long)
	create(t, short)
	ended(t, short)
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(long), long); err != nil {
		t.Fatal(err)
	}
	if long.Status.Phase != corev1.PodRunning {
		t.Errorf("when the fast pod ended the slow one was %q, want Running", long.Status.Phase)
	}
	ended(t, long)
	if d := time.Since(start); d < slow {
		t.Errorf("the slow pod ended after %v, before its run time %v", d, slow)
	}
}
