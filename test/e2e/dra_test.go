//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/poll"
)

// The DRA Module of TestKMM and what the test makes around it.
const (
	// modDRA runs a DRA driver (spec.dra) and goes through an ordered upgrade v1 → v2 while a
	// ResourceClaim of its driver is allocated on the node.
	modDRA = "gpu"
	// draDriver is its driver name, draClass its DeviceClass.
	draDriver = "gpu.e2e.kmm.io"
	draClass  = "gpu.e2e.kmm.io"
	// draAppNamespace holds the workload pod and its ResourceClaim.
	draAppNamespace = "e2e-dra-app"
	draClaim        = "dev"
	draWorkload     = "uses-dev"
	// claimPoll is fsm.ClaimsPoll: how often kmm reads the claims again while they hold a pair
	// (ResourceClaims are not watched).
	claimPoll = 5 * time.Second
)

// draModule is modDRA at version with spec.dra: the driver container is the pause image (as the
// device plugin of modKmod is), the DeviceClass selects the driver's devices.
func (k *kmmEnv) draModule(version string) *kmmv1beta1.Module {
	m := k.module(modDRA, version, k.kmodImages[modDRA+"-"+version].ref, false)
	m.Spec.DRA = &kmmv1beta1.DRASpec{
		Container:  kmmv1beta1.DevicePluginContainerSpec{Image: k.c.PauseImage()},
		DriverName: draDriver,
		DeviceClasses: []kmmv1beta1.DeviceClassSpec{{Name: draClass, Selectors: []resourcev1.DeviceSelector{
			{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", draDriver)}}}}},
	}
	return m
}

// testDRA: a Module with spec.dra runs its driver DaemonSet pod Ready on the real kubelet, its
// DeviceClass exists, the node gets the dra-ready label; kube-scheduler allocates a ResourceClaim
// of that DeviceClass on the node for a workload pod; an ordered upgrade v1 → v2 then waits in
// DevicePluginDraining (ClaimsAllocated) with the v1 driver kept and no unload pod, across two of
// kmm's claim reads; once the pod is gone and kube-controller-manager's resource claim controller
// deallocated the claim, the upgrade goes in order: v1 driver pod gone, unload, v2 load, v2 driver.
//
// The driver is the pause image: it does not register with the kubelet and publishes no
// ResourceSlice. The test publishes the slice the driver would (one device on this node), so that
// kube-scheduler allocates a real claim through kmm's DeviceClass. The kubelet cannot prepare the
// claim without the driver, so the workload pod stays Pending; nothing asserted needs it to run: the
// claim is allocated and reserved for the pod by the scheduler, and deallocated by the resource claim
// controller when the pod is deleted, whatever the kubelet did.
func testDRA(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	versionLabel := kmmv1beta1.ModuleVersionLabel(kmmNamespace, modDRA)
	k.setNodeLabel(t, versionLabel, "v1")
	start := time.Now()
	if err := k.cl.Create(ctx, k.draModule("v1")); err != nil {
		t.Fatal(err)
	}
	k.waitLoaded(t, modDRA, "v1")
	k.waitDRADriver(t, "v1")
	tm.add("DRA: Module created → Loaded and its driver pod Ready", start)
	k.waitNodeLabels(t, map[string]string{
		kmmv1beta1.ReadyLabel(kmmNamespace, modDRA):        "",
		kmmv1beta1.VersionReadyLabel(kmmNamespace, modDRA): "v1",
		kmmv1beta1.DRAReadyLabel(kmmNamespace, modDRA):     "",
	})
	k.checkDeviceClass(t)
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		m := &kmmv1beta1.Module{}
		if err := k.cl.Get(ctx, client.ObjectKey{Namespace: kmmNamespace, Name: modDRA}, m); err != nil {
			return false, err.Error()
		}
		return m.Status.DRA.AvailableNumber == 1, fmt.Sprintf("status.dra %+v", m.Status.DRA)
	})

	claim := k.allocateClaim(t)
	t.Logf("claim %s/%s allocated by kube-scheduler: %+v, reserved for %v", draAppNamespace, draClaim, claim.Status.Allocation.Devices.Results, claim.Status.ReservedFor)

	mark := k.pods.mark()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &kmmv1beta1.Module{}
		if err := k.cl.Get(ctx, client.ObjectKey{Namespace: kmmNamespace, Name: modDRA}, m); err != nil {
			return err
		}
		m.Spec.ModuleLoader.Container.Version = "v2"
		m.Spec.ModuleLoader.Container.ContainerImage = k.kmodImages[modDRA+"-v2"].ref
		return k.cl.Update(ctx, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	k.setNodeLabel(t, versionLabel, "v2")
	var st *kmmv1beta1.NodeModuleStatus
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		st = k.pair(t, modDRA)
		return st != nil && st.State == kmmv1beta1.StateDevicePluginDraining && st.Reason == "ClaimsAllocated", describeStatus(st)
	})
	tm.add("DRA: version label v2 → DevicePluginDraining, ClaimsAllocated", start)
	if !strings.Contains(st.Message, draAppNamespace+"/"+draClaim) {
		t.Errorf("the status message %q does not name the claim %s/%s", st.Message, draAppNamespace, draClaim)
	}
	k.waitModuleEvent(t, modDRA, "ClaimsAllocated")
	// Held across two of kmm's claim reads: the v1 driver stays Ready with its labels, no unload pod.
	deadline := time.Now().Add(2*claimPoll + time.Second)
	for time.Now().Before(deadline) {
		k.checkHeld(t, mark)
		time.Sleep(500 * time.Millisecond)
	}
	if c := k.getClaim(t); c.Status.Allocation == nil {
		t.Fatalf("the claim was deallocated during the hold: the hold proves nothing (%+v)", c.Status)
	}
	holdEnd := len(k.pods.since(mark))

	// The workload goes: kube-controller-manager's resource claim controller deallocates the claim.
	start = time.Now()
	zero := int64(0)
	if err := k.cs.CoreV1().Pods(draAppNamespace).Delete(ctx, draWorkload, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		c := k.getClaim(t)
		return c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0, fmt.Sprintf("claim status %+v", c.Status)
	})
	tm.add("DRA: workload pod deleted → claim deallocated by kube-controller-manager", start)
	k.waitLoaded(t, modDRA, "v2")
	k.waitDRADriver(t, "v2")
	tm.add("DRA: claim released → v2 Loaded and its driver pod Ready", start)
	k.waitNodeLabels(t, map[string]string{
		kmmv1beta1.VersionReadyLabel(kmmNamespace, modDRA): "v2",
		kmmv1beta1.DRAReadyLabel(kmmNamespace, modDRA):     "",
	})
	k.waitNoWorkerPod(t, modDRA)
	k.checkDRAOrder(t, mark, holdEnd)
	if err := k.cs.ResourceV1().ResourceSlices().Delete(ctx, draSliceName(k.node), metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}

// waitDRADriver waits until a DRA driver pod of modDRA's version runs on the node and is Ready.
func (k *kmmEnv) waitDRADriver(t *testing.T, version string) {
	t.Helper()
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		var seen []string
		for i := range pods {
			p := &pods[i]
			if draVersion(p, modDRA) != version {
				continue
			}
			if p.Spec.NodeName == k.node && p.Status.Phase == corev1.PodRunning && podReady(p) && p.DeletionTimestamp == nil {
				return true, ""
			}
			seen = append(seen, p.Name+" "+string(p.Status.Phase)+describe(p))
		}
		return false, fmt.Sprintf("DRA driver pods of %s %s: %v", modDRA, version, seen)
	})
}

// draVersion is the version of the Module's DRA driver a pod belongs to ("" when it is not one of
// its driver pods): the version-schedule-pod label its node selector requires.
func draVersion(p *corev1.Pod, module string) string {
	if p.Labels[contract.LabelDRA] != "true" || p.Labels[contract.LabelModuleName] != module {
		return ""
	}
	if v := p.Spec.NodeSelector[kmmv1beta1.DevicePluginVersionLabel(kmmNamespace, module)]; v != "" {
		return v
	}
	return "unversioned"
}

// waitNodeLabels waits until the node carries every label of want with its value.
func (k *kmmEnv) waitNodeLabels(t *testing.T, want map[string]string) {
	t.Helper()
	poll.Until(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		labels := k.nodeLabels(t)
		for key, v := range want {
			if got, ok := labels[key]; !ok || got != v {
				return false, fmt.Sprintf("node label %s = %q (set %v), want %q", key, got, ok, v)
			}
		}
		return true, ""
	})
}

// checkDeviceClass checks the Module's DeviceClass: kmm's labels of the Module, the selector.
func (k *kmmEnv) checkDeviceClass(t *testing.T) {
	t.Helper()
	dc, err := k.cs.ResourceV1().DeviceClasses().Get(context.Background(), draClass, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Module's DeviceClass %s: %v", draClass, err)
	}
	if dc.Labels[contract.LabelModuleNamespace] != kmmNamespace || dc.Labels[contract.LabelModuleName] != modDRA ||
		len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil || !strings.Contains(dc.Spec.Selectors[0].CEL.Expression, draDriver) {
		t.Errorf("DeviceClass %s: labels %v, selectors %+v; want kmm's labels of %s/%s and the Module's selector", draClass, dc.Labels, dc.Spec.Selectors, kmmNamespace, modDRA)
	}
}

func draSliceName(node string) string {
	return "kmm-e2e-" + node + "-" + strings.ReplaceAll(draDriver, ".", "-")
}

// allocateClaim publishes the ResourceSlice the driver would (one device on the node), creates a
// ResourceClaim of the Module's DeviceClass and a pod using it, and waits until kube-scheduler
// has allocated the claim on the node and reserved it for the pod.
func (k *kmmEnv) allocateClaim(t *testing.T) *resourcev1.ResourceClaim {
	t.Helper()
	ctx := context.Background()
	node := k.node
	slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: draSliceName(node)}, Spec: resourcev1.ResourceSliceSpec{
		Driver: draDriver, NodeName: &node, Pool: resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		Devices: []resourcev1.Device{{Name: "dev0"}},
	}}
	if _, err := k.cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: draAppNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: draAppNamespace, Name: draClaim},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
			{Name: "dev", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: draClass}}}}}}
	if _, err := k.cs.ResourceV1().ResourceClaims(draAppNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claimName := draClaim
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: draAppNamespace, Name: draWorkload}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimName: &claimName}},
		Containers: []corev1.Container{{Name: "app", Image: k.c.PauseImage(),
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}}},
	}}
	if _, err := k.cs.CoreV1().Pods(draAppNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var c *resourcev1.ResourceClaim
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		c = k.getClaim(t)
		a := c.Status.Allocation
		if a == nil || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].Name != draWorkload {
			p, err := k.cs.CoreV1().Pods(draAppNamespace).Get(ctx, draWorkload, metav1.GetOptions{})
			return false, fmt.Sprintf("claim status %+v; pod %+v %v", c.Status, p.Status.Conditions, err)
		}
		return true, ""
	})
	a := c.Status.Allocation
	if len(a.Devices.Results) != 1 || a.Devices.Results[0].Driver != draDriver || a.Devices.Results[0].Device != "dev0" || a.NodeSelector == nil {
		t.Fatalf("the claim's allocation %+v: want dev0 of %s with a node selector", a, draDriver)
	}
	p, err := k.cs.CoreV1().Pods(draAppNamespace).Get(ctx, draWorkload, metav1.GetOptions{})
	if err != nil || p.Spec.NodeName != node {
		t.Fatalf("the workload pod is not bound to %s: %v %v", node, p.Spec.NodeName, err)
	}
	return c
}

func (k *kmmEnv) getClaim(t *testing.T) *resourcev1.ResourceClaim {
	t.Helper()
	c, err := k.cs.ResourceV1().ResourceClaims(draAppNamespace).Get(context.Background(), draClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkHeld checks the pair waits for the claim: DevicePluginDraining, the v1 driver pod Running
// and Ready with the node's ready and dra-ready labels, no unload pod since mark.
func (k *kmmEnv) checkHeld(t *testing.T, mark int) {
	t.Helper()
	if st := k.pair(t, modDRA); st == nil || st.State != kmmv1beta1.StateDevicePluginDraining {
		t.Fatalf("while the claim is allocated the pair left DevicePluginDraining: %s", describeStatus(st))
	}
	for _, e := range k.pods.since(mark) {
		if isWorker(e.pod, modDRA) {
			t.Fatalf("a worker pod %s (%s) while the claim is allocated", e.pod.Name, e.pod.Labels[contract.LabelAction])
		}
		if draVersion(e.pod, modDRA) == "v1" && podGone(e) {
			t.Fatalf("the v1 DRA driver pod %s ended (%s %s) while the claim is allocated", e.pod.Name, e.typ, e.pod.Status.Phase)
		}
	}
	labels := k.nodeLabels(t)
	for _, key := range []string{kmmv1beta1.ReadyLabel(kmmNamespace, modDRA), kmmv1beta1.DRAReadyLabel(kmmNamespace, modDRA)} {
		if _, ok := labels[key]; !ok {
			t.Fatalf("node label %s gone while the claim is allocated", key)
		}
	}
}

// podGone says whether the event shows the pod gone or its containers ended (Succeeded or Failed: the
// kubelet stopped it, the API object goes a moment later); kmm counts a driver pod until then.
func podGone(e podEvent) bool {
	return e.typ == "DELETED" || e.pod.Status.Phase == corev1.PodSucceeded || e.pod.Status.Phase == corev1.PodFailed
}

// waitModuleEvent waits for an Event of reason on the Module.
func (k *kmmEnv) waitModuleEvent(t *testing.T, module, reason string) {
	t.Helper()
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		evs, err := k.cs.EventsV1().Events(kmmNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Kind == "Module" && e.Regarding.Name == module {
				if e.Reason == reason {
					t.Logf("Event: %s %s: %s", e.Type, e.Reason, e.Note)
					return true, ""
				}
				seen = append(seen, e.Reason)
			}
		}
		return false, fmt.Sprintf("no Event %s on Module %s; seen %v", reason, module, seen)
	})
}

// checkDRAOrder checks, from the pod watch in the API server's order since mark, after the hold
// (the events before holdEnd, checked by checkHeld as they came): the v1 driver pod ended before
// the unload pod is created, the v2 load pod created after the unload pod
// Succeeded, the v2 driver pod created after the v2 load pod Succeeded.
func (k *kmmEnv) checkDRAOrder(t *testing.T, mark, holdEnd int) {
	t.Helper()
	events := k.pods.since(mark)
	action := func(e podEvent) string { return e.pod.Labels[contract.LabelAction] }
	driverV1Gone := indexOf(events, func(e podEvent) bool { return draVersion(e.pod, modDRA) == "v1" && podGone(e) })
	unloadCreated := indexOf(events, func(e podEvent) bool {
		return e.typ == "ADDED" && isWorker(e.pod, modDRA) && action(e) == "unload"
	})
	unloadDone := indexOf(events, func(e podEvent) bool {
		return isWorker(e.pod, modDRA) && action(e) == "unload" && e.pod.Status.Phase == corev1.PodSucceeded
	})
	loadCreated := indexOf(events, func(e podEvent) bool { return e.typ == "ADDED" && isWorker(e.pod, modDRA) && action(e) == "load" })
	loadDone := indexOf(events, func(e podEvent) bool {
		return isWorker(e.pod, modDRA) && action(e) == "load" && e.pod.Status.Phase == corev1.PodSucceeded
	})
	driverV2Created := indexOf(events, func(e podEvent) bool { return e.typ == "ADDED" && draVersion(e.pod, modDRA) == "v2" })
	order := []struct {
		name string
		at   int
	}{{"the hold ended", holdEnd - 1}, {"v1 driver pod ended", driverV1Gone}, {"unload pod created", unloadCreated},
		{"unload pod Succeeded", unloadDone}, {"v2 load pod created", loadCreated}, {"v2 load pod Succeeded", loadDone},
		{"v2 driver pod created", driverV2Created}}
	for i, o := range order {
		if o.at < 0 && i > 0 {
			t.Fatalf("missing from the watch: %s\n%s", o.name, describeEvents(events))
		}
		if i > 0 && o.at <= order[i-1].at {
			t.Errorf("%s (event %d) not after %s (event %d)\n%s", o.name, o.at, order[i-1].name, order[i-1].at, describeEvents(events))
		}
	}
}

// deleteDRAApp removes what testDRA made outside the Modules: the workload namespace (its claim).
func (k *kmmEnv) deleteDRAApp(t *testing.T) {
	t.Helper()
	err := k.cs.CoreV1().Namespaces().Delete(context.Background(), draAppNamespace, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
}

// checkDeviceClassGone checks the Module's DeviceClass went with the Module.
func (k *kmmEnv) checkDeviceClassGone(t *testing.T) {
	t.Helper()
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		_, err := k.cs.ResourceV1().DeviceClasses().Get(context.Background(), draClass, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("DeviceClass %s: %v", draClass, err)
	})
}
