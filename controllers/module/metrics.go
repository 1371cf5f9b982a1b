package module

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The Module side's metric (SPEC §8), registered on controller-runtime's registry and served on
// the manager's metrics endpoint; the node side registers the others (package node).
var pairsByState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kmm_pairs",
	Help: "Number of (node, module) pairs per Module and state.",
}, []string{"namespace", "module", "state"})

func init() {
	metrics.Registry.MustRegister(pairsByState)
}
