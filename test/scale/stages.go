package scale

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	toolscache "k8s.io/client-go/tools/cache"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// transitions records when the harness's cache first saw each pair in a state: with the agent's
// record of when it ended each worker pod, they split a load's time into stages (Stages).
type transitions struct {
	mu      sync.Mutex
	seen    map[string]time.Time                   // "node namespace/name state" → first seen
	entries map[string]kmmv1beta1.NodeModuleStatus // the same → the status entry then (first node only)
	first   string                                 // the node whose entries are kept
}

func newTransitions(first string) *transitions {
	return &transitions{seen: map[string]time.Time{}, entries: map[string]kmmv1beta1.NodeModuleStatus{}, first: first}
}

// entry is the status entry of the pair on the first node when it was first seen in state.
func (t *transitions) entry(node, module string, state kmmv1beta1.ModuleState) (kmmv1beta1.NodeModuleStatus, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[transitionKey(node, module, state)]
	return e, ok
}

// handler records the states of the NMCs the harness's cache sees.
func (t *transitions) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    t.record,
		UpdateFunc: func(_, obj any) { t.record(obj) },
	}
}

func (t *transitions) record(obj any) {
	nmc, ok := obj.(*kmmv1beta1.NodeModulesConfig)
	if !ok {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, st := range nmc.Status.Modules {
		key := transitionKey(nmc.Name, st.Namespace+"/"+st.Name, st.State)
		if _, ok := t.seen[key]; !ok {
			t.seen[key] = now
			if nmc.Name == t.first {
				t.entries[key] = *st.DeepCopy()
			}
		}
	}
}

func transitionKey(node, module string, state kmmv1beta1.ModuleState) string {
	return fmt.Sprintf("%s %s %s", node, module, state)
}

// at is when the pair was first seen in state.
func (t *transitions) at(node, module string, state kmmv1beta1.ModuleState) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.seen[transitionKey(node, module, state)]
	return at, ok
}

// Stages split a phase's time per pair (seconds; median, 90th percentile and maximum over the
// pairs): from the phase's start until the harness saw the pair Loading, from then until the
// simulated kubelet ended its worker pod, and from then until the harness saw it Loaded.
type Stages struct {
	ToLoading      Spread `json:"toLoading"`
	LoadingToEnded Spread `json:"loadingToPodEnded"`
	EndedToLoaded  Spread `json:"podEndedToLoaded"`
}

// Spread is a distribution's median, 90th percentile and maximum.
type Spread struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	Max float64 `json:"max"`
}

func spread(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	slices.Sort(v)
	return Spread{P50: v[len(v)/2], P90: v[len(v)*9/10], Max: v[len(v)-1]}
}

func (s Spread) String() string { return fmt.Sprintf("%.1f/%.1f/%.1f", s.P50, s.P90, s.Max) }

// stages computes the stages of the pairs on the nodes whose name has prefix, for runs the agent
// ended after start.
func (h *harness) stages(start time.Time, prefix string) Stages {
	var toLoading, toEnded, toLoaded []float64
	for _, r := range h.agent.Runs() {
		if !strings.HasPrefix(r.Node, prefix) || r.Time.Before(start) {
			continue
		}
		loading, ok1 := h.seen.at(r.Node, r.Module, kmmv1beta1.StateLoading)
		loaded, ok2 := h.seen.at(r.Node, r.Module, kmmv1beta1.StateLoaded)
		if !ok1 || !ok2 || loading.Before(start) {
			continue
		}
		toLoading = append(toLoading, loading.Sub(start).Seconds())
		toEnded = append(toEnded, r.Time.Sub(loading).Seconds())
		toLoaded = append(toLoaded, loaded.Sub(r.Time).Seconds())
	}
	return Stages{ToLoading: spread(toLoading), LoadingToEnded: spread(toEnded), EndedToLoaded: spread(toLoaded)}
}
