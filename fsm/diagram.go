package fsm

import (
	"fmt"
	"strings"

	"github.com/kmm-project/kmm/internal/statediagram"
)

// StateDescriptions explain each state in one paragraph; the diagrams README shows them.
var StateDescriptions = map[State]string{
	Absent: "The module is not loaded on the node and nothing is in flight. A pair starts here. " +
		"When the NMC spec has an entry for the kernel the node runs and the node is Ready and " +
		"schedulable (seed 000, rule 2), it moves to Loading. An Absent pair with no spec entry left " +
		"and no worker pod running is removed from the NMC status.",
	Loading: "A load worker pod is wanted. It is created only on a Ready, schedulable node whose kernel " +
		"equals the spec entry's kernel; at most one worker pod exists per pair (its name is " +
		"deterministic). The pod's success (reported in this boot) leads to Loaded, its failure to " +
		"LoadBackOff. If the spec entry goes away or no longer matches the node's kernel before a pod " +
		"runs, the pair returns to Absent.",
	Loaded: "The worker reported a successful load of the config recorded in status, in the boot " +
		"recorded in status. The node carries the ready label (and version.ready with the loaded " +
		"version). A new boot ID, a kernel other than the loaded one, or a Ready transition newer than " +
		"the last worker run (rule 5) reloads. A spec entry that differs or is gone (rules 3 and 4) " +
		"unloads, through DevicePluginDraining when a device plugin pod runs on the node or the upgrade " +
		"drain has workloads to move. A version-module label asking for another version starts an ordered " +
		"upgrade (seed 002).",
	DevicePluginDraining: "The module must be unloaded (or upgraded) but its device plugin pod still runs " +
		"on the node, or workloads that use it must be drained first (upgradePolicy.drain: the node is " +
		"cordoned, pods are evicted honouring PodDisruptionBudgets, then escalated as seed 004's timeouts " +
		"pass; the drain's start and strongest strategy are kept in status). The ready label is gone, so the " +
		"DaemonSet removes the device plugin pod. A Module with a DRA driver waits here while ResourceClaims " +
		"allocated on the node with its driver's devices remain (ClaimsAllocated, said once): the ready label " +
		"and the driver stay for the kubelet to unprepare them, and an upgrade drain evicts the driver pod " +
		"last, once they are released. With upgradePolicy.drain.jobs the pods of Jobs are waited for " +
		"(WaitingForJobs, said once) up to jobs.waitSeconds, then drained as the others (JobWaitExpired, said " +
		"once, a Warning). No unload pod runs in this state. When everything is gone " +
		"the pair moves to Unloading; if the spec comes back to the loaded config and no upgrade is " +
		"requested, back to Loaded.",
	Unloading: "An unload worker pod is wanted for the loaded config. It is created only on a Ready, " +
		"schedulable node whose kernel equals the loaded config's kernel and while no device plugin pod " +
		"of the module runs there. Success leads to Absent, or to Upgrading during an ordered upgrade; " +
		"failure, a timed-out or a refused pod to UnloadBackOff.",
	Upgrading: "An ordered upgrade unloaded the old version and waits for the spec entry of the new " +
		"version (the version label controller sets the worker-pod label, then the Module→NMC " +
		"controller writes the entry). It then loads the new version. If the upgrade is abandoned " +
		"(no version-module label), or no entry for the node's kernel comes within 30 s of the worker-pod label allowing it " +
		"(no kernel mapping: the node may have booted another kernel mid-upgrade; or the Module is at another version), the pair is Absent and kmm lifts its cordon.",
	LoadBackOff: "The last load failed (WorkerFailed), its pod ran past the worker timeout " +
		"(WorkerTimedOut: the pod is deleted), or no pod could be made (WorkerRejected: a config no " +
		"worker can act on, a pod the API server refused, or a service account kmm could not read); attempts counts consecutive failures and " +
		"status.reason names the failure class. The failed pod stays for inspection. After an " +
		"exponential back-off (10 s doubling up to 5 min) the pair retries, whatever the worker said; a " +
		"config refused as invalid (reason InvalidConfig) is not retried until the spec entry changes. " +
		"A spec entry that replaces the failed config retries at once; a removed entry or another " +
		"kernel returns it to Absent. HookFailed: the worker loaded the module and the Module's " +
		"postLoad hook failed (reason PostLoadHookFailed): the module is recorded as loaded, and the " +
		"retry runs the load pod, hook included, again.",
	UnloadBackOff: "The last unload failed (for example the module is in use), its preUnload hook " +
		"failed before the worker ran (HookFailed, reason PreUnloadHookFailed: the module stays loaded), or its pod ran past the " +
		"worker timeout. After the back-off it retries. A reboot unloads everything, so the pair becomes " +
		"Absent; a spec entry equal to the loaded config again returns it to Loaded. An unload pod that " +
		"timed out but succeeded after all (its deletion lost the race) ends the unload: Absent, or " +
		"Upgrading during an ordered upgrade.",
}

// DOT returns the machine as Graphviz DOT, from stateless's ToGraph, with edges in a stable order.
func DOT() string { return statediagram.DOT(newMachine(Absent).ToGraph()) }

// Mermaid returns the machine as a Mermaid state diagram, read from the DOT output so that both
// diagrams always show the same configuration.
func Mermaid() string { return statediagram.Mermaid(DOT(), string(Absent)) }

// DiagramsREADME returns docs/state-diagrams/README.md: the Mermaid diagram and a paragraph per state.
func DiagramsREADME() string {
	var b strings.Builder
	b.WriteString("# The (node, module) state machine\n\n")
	b.WriteString("Generated by `make diagrams` from `fsm.Configure`, the configuration the NMC controller runs; " +
		"do not edit. `machine.dot` is stateless's `ToGraph()` output, `machine.mmd` the same graph in Mermaid. " +
		"Guards are in brackets. Triggers are derived from observed facts by `fsm.Step` (see `fsm/derive.go`).\n\n")
	b.WriteString("```mermaid\n" + Mermaid() + "```\n\n## States\n\n")
	for _, s := range States {
		fmt.Fprintf(&b, "### %s\n\n%s\n\n", s, StateDescriptions[s])
	}
	b.WriteString("## Triggers\n\n")
	for _, t := range AllTriggers {
		fmt.Fprintf(&b, "- `%s`\n", t)
	}
	return b.String()
}

// DiagramFiles maps each file of docs/state-diagrams/ to its content.
func DiagramFiles() map[string]string {
	return map[string]string{
		"machine.dot": DOT(),
		"machine.mmd": Mermaid(),
		"README.md":   DiagramsREADME(),
	}
}

// AllTriggers lists every trigger.
var AllTriggers = []Trigger{SpecSet, SpecChanged, SpecRemoved, SpecRestored, KernelChanged, NodeRebooted,
	WorkerSucceeded, WorkerFailed, HookFailed, WorkerTimedOut, WorkerRejected, BackOffExpired, UpgradeRequested, DevicePluginGone, ClaimsAllocated, WaitingForJobs, JobWaitExpired, UpgradeAbandoned, Adopted}
