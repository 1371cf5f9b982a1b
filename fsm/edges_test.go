package fsm

// The machine's edges and a replay of transition logs, for the tests that check a log against the
// machine (production code never replays: the state is stored in the NMC status).

import (
	"fmt"
	"sync"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// Edge is one transition the machine permits: From --Trigger--> To under some facts.
type Edge struct {
	From    State
	Trigger Trigger
	To      State
}

var (
	edgesOnce sync.Once
	edges     map[Edge]bool
)

// permittedEdges returns every transition the machine permits, found by firing each trigger in each state
// under every combination of the facts its guards read.
func permittedEdges() map[Edge]bool {
	edgesOnce.Do(func() {
		edges = map[Edge]bool{}
		for _, f := range guardFactCombinations() {
			for _, s := range States {
				for _, t := range AllTriggers {
					if to, err := fire(s, t, f); err == nil {
						edges[Edge{From: s, Trigger: t, To: to}] = true
					}
				}
			}
		}
	})
	return edges
}

// guardFactCombinations returns facts covering every outcome of every guard.
func guardFactCombinations() []*Facts {
	var out []*Facts
	for i := range 128 {
		kernelMatch, dp, upgrade, loadedHere, upstreamRecord := i&1 != 0, i&2 != 0, i&4 != 0, i&8 != 0, i&16 != 0
		reload, reloadFailed := i&32 != 0, i&64 != 0
		f := &Facts{Spec: &kmmv1beta1.NodeModuleSpec{Config: kmmv1beta1.ModuleConfig{KernelVersion: "k"}}, DevicePluginRunning: dp}
		f.Node.KernelVersion = "other"
		if kernelMatch {
			f.Node.KernelVersion = "k"
		}
		if upgrade {
			f.Node.UpgradeTarget = "v2"
		}
		if loadedHere {
			f.Status.Config = &kmmv1beta1.ModuleConfig{KernelVersion: f.Node.KernelVersion}
		}
		if upstreamRecord {
			// A record upstream KMM left (adopt.go), of what the spec loads, in the node's boot.
			cfg := f.Spec.Config
			f.Status.Config, f.Status.BootID, f.Node.BootID, f.fromUpstream = &cfg, "b", "b", true
		}
		if reload {
			// An image bump a reload worker may make (reloadable), unless a device plugin runs.
			mc := kmmv1beta1.ModuleConfig{KernelVersion: f.Node.KernelVersion, ContainerImage: "r/m:2", Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "m"}}
			old := mc
			old.ContainerImage = "r/m:1"
			f.Spec.Config, f.Status.Config, f.Node.UpgradeTarget = mc, &old, ""
		}
		if reloadFailed {
			// A failed reload whose unload half did not succeed: the previous config is kept.
			f.Worker = Worker{Action: contract.ActionReload, Phase: PodFailed}
		}
		out = append(out, f)
	}
	return out
}

// replay replays a transition log from its first entry and returns the state it ends in. Every
// entry must start where the previous one ended and be a transition the machine permits.
func replay(log []kmmv1beta1.Transition) (State, error) {
	if len(log) == 0 {
		return Absent, nil
	}
	state := log[0].From
	for i, tr := range log {
		if tr.From != state {
			return state, fmt.Errorf("entry %d starts in %s, but the log was in %s", i, tr.From, state)
		}
		if !permittedEdges()[Edge{From: tr.From, Trigger: Trigger(tr.Trigger), To: tr.To}] {
			return state, fmt.Errorf("entry %d: %s --%s--> %s is not a transition of the machine", i, tr.From, tr.Trigger, tr.To)
		}
		state = tr.To
	}
	return state, nil
}
