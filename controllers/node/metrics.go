package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The node side's metrics (SPEC §8; the Module side registers kmm_pairs), registered on controller-runtime's registry and served on the
// manager's metrics endpoint.
var (
	transitionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kmm_transitions_total",
		Help: "State machine transitions of (node, module) pairs.",
	}, []string{"from", "to", "trigger"})

	unpermittedTriggersTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kmm_unpermitted_triggers_total",
		Help: "Triggers the state machine did not permit in the pair's state (a bug or an impossible observation).",
	}, []string{"state"})

	workerPodDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kmm_worker_pod_duration_seconds",
		Help:    "Time from a worker pod's creation to its end.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 10),
	}, []string{"action", "outcome"})

	workerFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kmm_worker_failures_total",
		Help: "Failed worker pods by action and reason class.",
	}, []string{"action", "reason"})
)

func init() {
	metrics.Registry.MustRegister(transitionsTotal, unpermittedTriggersTotal, workerPodDuration, workerFailuresTotal)
}
