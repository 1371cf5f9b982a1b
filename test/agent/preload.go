package agent

import kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"

// Preload puts module ("<namespace>/<name>") with cfg into the simulated kernel of node without a
// worker pod: what another operator (upstream KMM, in the takeover tests) loaded before kmm came.
func (a *Agent) Preload(node, module string, cfg kmmv1beta1.ModuleConfig) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if st := a.nodes[node]; st != nil {
		st.loaded[module] = *cfg.DeepCopy()
	}
}
