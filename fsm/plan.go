package fsm

import (
	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// plan says what must be true while the pair is in its state: the worker pod it needs (created only
// on a Ready, schedulable node and for the kernel the node runs — rules 1 to 4 of seed 000), the
// finished pods to clean up, the node labels, and when to look again.
func plan(f *Facts) Plan {
	p := Plan{}
	p.Ready, p.VersionReady = readyLabels(f)
	switch f.state() {
	case Loading:
		planWorker(f, &p, f.loadAction())
	case Unloading:
		planWorker(f, &p, contract.ActionUnload)
	case Upgrading:
		p.DeleteWorker = f.workerFinished()
		p.RequeueAfter = max(f.Status.LastTransitionTime.Add(UpgradeSpecGrace).Sub(f.Now), 0)
		p.Waiting = "waiting for the spec entry of version " + f.Node.UpgradeTarget
	case LoadBackOff, UnloadBackOff:
		// The failed pod stays for inspection until the retry replaces it.
		p.RequeueAfter = max(f.Status.LastTransitionTime.Add(f.BackOff.Delay(f.Status.Attempts)).Sub(f.Now), 0)
		p.Waiting = "backing off after " + f.Status.Message
		// Older finished pods say nothing about the last failure: they go.
		p.DeleteWorker = f.workerFinished() && !f.failedPodOfLastAttempt()
		if f.failureTerminal() {
			p.RequeueAfter, p.Waiting = 0, "waiting for a new config: "+f.Status.Message
		}
	default:
		p.DeleteWorker = f.workerFinished()
		if f.Worker.Phase == PodRunning {
			p.Waiting = "waiting for the " + string(f.Worker.Action) + " worker pod of an earlier state to finish"
		}
	}
	if len(f.Claims) > 0 && (p.RequeueAfter == 0 || p.RequeueAfter > ClaimsPoll) {
		p.RequeueAfter = ClaimsPoll // ResourceClaims are not watched
	}
	if f.workerOverdue() {
		p.DeleteWorker = true // past the worker timeout: it holds the pair's pod name
	} else if f.Worker.Phase == PodRunning && !f.Worker.Created.IsZero() && p.RequeueAfter == 0 {
		// Pod events wake the pair; this catches a pod that never reports.
		p.RequeueAfter = f.Worker.Created.Add(f.workerTimeout()).Sub(f.Now)
	}
	return p
}

// planWorker plans the worker pod of a Loading or Unloading pair.
func planWorker(f *Facts, p *Plan, action contract.Action) {
	switch {
	case f.Worker.Phase == PodRunning:
		p.Waiting = "worker pod running"
	case f.workerFinished():
		p.DeleteWorker = true // recorded, or stale: make room for the current attempt
	case !f.Node.Ready:
		p.Waiting = "node not Ready"
	case !f.nodeUsable():
		p.Waiting = "node cordoned"
	case action == contract.ActionLoad && !f.specKernelMatches():
		p.Waiting = "spec entry is not for the node's kernel " + f.Node.KernelVersion
	case action == contract.ActionUnload && !f.statusKernelMatches():
		p.Waiting = "loaded config is not for the node's kernel " + f.Node.KernelVersion
	case action != contract.ActionLoad && (f.DevicePluginRunning || len(f.Claims) > 0):
		p.Waiting = heldBy(f)
	case action == contract.ActionLoad && f.specProblem() != nil:
		p.Waiting = "the spec entry's config is invalid"
	default:
		p.CreateWorker = &WorkerIntent{Action: action, Attempt: f.Status.Attempts, Entry: workerEntry(f, action)}
		if action == contract.ActionReload {
			p.CreateWorker.Previous = f.Status.Config.DeepCopy()
		}
	}
}

// heldBy says why an unload or reload waits: the device plugin (or DRA driver) pod, or claims.
func heldBy(f *Facts) string {
	if f.DevicePluginRunning {
		return "device plugin pod still on the node"
	}
	return claimsMessage(f.Claims)
}

// workerEntry is what a new worker pod loads (the spec entry) or unloads (the loaded config).
func workerEntry(f *Facts, action contract.Action) kmmv1beta1.NodeModuleSpec {
	if action != contract.ActionUnload {
		return *f.Spec.DeepCopy()
	}
	e := kmmv1beta1.NodeModuleSpec{
		Namespace:          f.Status.Namespace,
		Name:               f.Status.Name,
		Config:             *f.Status.Config.DeepCopy(),
		ServiceAccountName: f.Status.ServiceAccountName,
		ImageRepoSecret:    f.Status.ImageRepoSecret.DeepCopy(),
		Tolerations:        copyTolerations(f.Status.Tolerations),
		Hooks:              f.Status.Hooks.DeepCopy(),
	}
	return e
}
