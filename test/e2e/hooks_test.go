//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/e2e"
	"github.com/kmm-project/kmm/test/poll"
)

// modHooked is the Module of testHooksAndValidation: an automatic rollout with a validation pod,
// and postLoad and preUnload hooks. It loads modLate's kmod image once modLate is gone.
const modHooked = "hooked"

// hookDir is the host directory the hooks write to (below the worker's dry-run sandbox, as every
// host path of a worker pod in this test).
const hookDir = "/var/lib/kmm-e2e-hooks"

// testHooksAndValidation is issue 40's "the real node runs a validation pod and a pre-unload
// hook": the real kubelet runs the load pod's worker (init container) then its postLoad hook, then
// the rollout's validation pod, which makes the node Upgraded; deleting the Module runs the
// preUnload hook (init container) and then the unload worker. The hooks and the validation are
// the probe image; the hooks write a file into their host path and report it as their
// termination message.
func testHooksAndValidation(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	start := time.Now()
	probe, err := e2e.GoBinaryImage(ctx, t.TempDir(), "github.com/kmm-project/kmm/test/e2e/probe")
	if err != nil {
		t.Fatal(err)
	}
	probeRef, err := k.c.PushImage("kmm-e2e/probe:1", probe)
	if err != nil {
		t.Fatal(err)
	}
	tm.add("hooks: probe image built and pushed", start)
	mark := k.pods.mark()
	start = time.Now()
	m := k.module(modHooked, "v1", k.kmodImages[modLate].ref, false)
	m.Spec.ModuleLoader.Container.Modprobe.ModuleName = kernelModules[modLate]
	hook := func(name string) *kmmv1beta1.ModuleHook {
		return &kmmv1beta1.ModuleHook{Image: probeRef, Args: []string{"write:" + hookDir + "/" + name + "=done"}, HostPaths: []string{hookDir}}
	}
	m.Spec.ModuleLoader.Hooks = &kmmv1beta1.ModuleHooks{PostLoad: hook("post-load"), PreUnload: hook("pre-unload")}
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Automatic: true,
		Validation: &kmmv1beta1.ValidationSpec{Container: kmmv1beta1.ValidationContainerSpec{Image: probeRef, Args: []string{"exists:/etc/hostname"}}}}
	if err := k.cl.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	k.waitLoaded(t, modHooked, "v1")
	tm.add("hooks: Module created → Loaded (worker, then postLoad hook)", start)
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		got := &kmmv1beta1.Module{}
		if err := k.cl.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			return false, err.Error()
		}
		r := got.Status.Rollout
		return r != nil && r.NodesByUpgradeState[kmmv1beta1.Upgraded] == 1, fmt.Sprintf("rollout %+v", r)
	})
	tm.add("hooks: Module created → node Upgraded (validation pod Succeeded)", start)

	events := k.pods.since(mark)
	// The load pod's first Succeeded event: its deletion, also seen as Succeeded, may come after the
	// validation pod's creation.
	loadDone := firstOf(events, func(p *corev1.Pod) bool { return isWorker(p, modHooked) && p.Status.Phase == corev1.PodSucceeded })
	validation := lastOf(events, func(p *corev1.Pod) bool {
		return p.Labels[contract.LabelValidation] == "true" && p.Labels[contract.LabelModuleName] == modHooked
	})
	switch {
	case loadDone < 0 || validation < 0:
		t.Fatalf("from the watch: load pod Succeeded at %d, validation pod at %d\n%s", loadDone, validation, describeEvents(events))
	case events[validation].pod.Status.Phase != corev1.PodSucceeded:
		t.Errorf("the validation pod last seen %s", describe(events[validation].pod))
	case firstOf(events, func(p *corev1.Pod) bool { return p.Labels[contract.LabelValidation] == "true" }) < loadDone:
		t.Errorf("the validation pod appeared before the load pod finished\n%s", describeEvents(events))
	}
	checkHookRan(t, k, events[loadDone].pod, contract.ContainerName, contract.PostLoadHookContainer, "post-load")

	mark = k.pods.mark()
	start = time.Now()
	if err := k.cl.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	k.waitNoWorkerPod(t, modHooked)
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		st := k.pair(t, modHooked)
		return st == nil, describeStatus(st)
	})
	tm.add("hooks: Module deleted → preUnload hook, then unloaded", start)
	events = k.pods.since(mark)
	unloadDone := lastOf(events, func(p *corev1.Pod) bool {
		return isWorker(p, modHooked) && p.Labels[contract.LabelAction] == "unload" && p.Status.Phase == corev1.PodSucceeded
	})
	if unloadDone < 0 {
		t.Fatalf("no unload pod of %s Succeeded\n%s", modHooked, describeEvents(events))
	}
	checkHookRan(t, k, events[unloadDone].pod, contract.PreUnloadHookContainer, contract.ContainerName, "pre-unload")
	k.setNodeLabel(t, kmmv1beta1.ModuleVersionLabel(kmmNamespace, modHooked), "")
	// The Module owns its validation pod: the garbage collector removes it with the Module.
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		for i := range pods {
			if p := &pods[i]; p.Labels[contract.LabelValidation] == "true" && p.Labels[contract.LabelModuleName] == modHooked {
				return false, "the validation pod " + p.Name + " (" + string(p.Status.Phase) + ") is left after its Module was deleted"
			}
		}
		return true, ""
	})
}

// checkHookRan checks a finished worker pod: its init container (first) finished before its
// container (then) started, both exited 0, and the hook wrote its file on the host and reported it.
func checkHookRan(t *testing.T, k *kmmEnv, pod *corev1.Pod, first, then, hook string) {
	t.Helper()
	a, okA := statusOf(pod.Status.InitContainerStatuses, first)
	b, okB := statusOf(pod.Status.ContainerStatuses, then)
	if !okA || !okB || a.ExitCode != 0 || b.ExitCode != 0 {
		t.Fatalf("pod %s: %s then %s, want both terminated with exit 0: %s", pod.Name, first, then, describe(pod))
	}
	if b.StartedAt.Before(&a.FinishedAt) {
		t.Errorf("pod %s: %s started at %v, before %s finished at %v", pod.Name, then, b.StartedAt, first, a.FinishedAt)
	}
	t.Logf("pod %s: %s %v-%v, then %s %v-%v", pod.Name, first, a.StartedAt.Time, a.FinishedAt.Time, then, b.StartedAt.Time, b.FinishedAt.Time)
	msg := a.Message
	if first == contract.ContainerName {
		msg = b.Message
	}
	if want := "write " + hookDir + "/" + hook + "=ok"; !strings.Contains(msg, want) {
		t.Errorf("the %s hook's termination message %q, want %q", hook, msg, want)
	}
	if data, err := os.ReadFile(filepath.Join(k.sandbox, hookDir, hook)); err != nil || string(data) != "done" {
		t.Errorf("the %s hook's file on the host: %q, %v", hook, data, err)
	}
}

func statusOf(list []corev1.ContainerStatus, name string) (*corev1.ContainerStateTerminated, bool) {
	for _, cs := range list {
		if cs.Name == name && cs.State.Terminated != nil {
			return cs.State.Terminated, true
		}
	}
	return nil, false
}

func firstOf(events []podEvent, match func(*corev1.Pod) bool) int {
	return indexOf(events, func(e podEvent) bool { return match(e.pod) })
}

func lastOf(events []podEvent, match func(*corev1.Pod) bool) int {
	for i := len(events) - 1; i >= 0; i-- {
		if match(events[i].pod) {
			return i
		}
	}
	return -1
}
