package upgrade

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// upgradeStates are the states kmm_rollout_nodes reports, each set (to 0 when none) on every
// rollout step.
var upgradeStates = []kmmv1beta1.UpgradeState{kmmv1beta1.UpgradePending, kmmv1beta1.Upgrading, kmmv1beta1.Upgraded,
	kmmv1beta1.UpgradeFailed, kmmv1beta1.UpgradeSkipped}

// The rollout's metrics (docs/install.md#metrics), on controller-runtime's registry: the manager
// serves them.
var (
	rolloutNodes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kmm_rollout_nodes",
		Help: "Number of selected nodes per Module and upgrade state of its automatic rollout.",
	}, []string{"namespace", "module", "state"})
	rolloutPaused = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kmm_rollout_paused",
		Help: "1 while a Module's automatic rollout is paused (reason FailureBudgetExceeded or PausedByUser), else 0.",
	}, []string{"namespace", "module", "reason"})
)

func init() {
	metrics.Registry.MustRegister(rolloutNodes, rolloutPaused)
}

// recordMetrics sets the rollout's gauges from its status (nil: the Module is not rolled out, its
// series go).
func recordMetrics(namespace, name string, st *kmmv1beta1.RolloutStatus) {
	labels := prometheus.Labels{"namespace": namespace, "module": name}
	if st == nil {
		rolloutNodes.DeletePartialMatch(labels)
		rolloutPaused.DeletePartialMatch(labels)
		return
	}
	for _, s := range upgradeStates {
		rolloutNodes.WithLabelValues(namespace, name, string(s)).Set(float64(st.NodesByUpgradeState[s]))
	}
	for _, reason := range []string{kmmv1beta1.ReasonFailureBudgetExceeded, kmmv1beta1.ReasonPausedByUser} {
		v := 0.0
		if st.Paused != nil && st.Paused.Reason == reason {
			v = 1
		}
		rolloutPaused.WithLabelValues(namespace, name, reason).Set(v)
	}
}
