package upgrade

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// upgradeStates are the states kmm_rollout_nodes reports, each set (to 0 when none) on every
// rollout step.
var upgradeStates = []kmmv1beta1.UpgradeState{kmmv1beta1.UpgradePending, kmmv1beta1.Upgrading, kmmv1beta1.Upgraded,
	kmmv1beta1.UpgradeFailed, kmmv1beta1.UpgradeSkipped, kmmv1beta1.RollingBack, kmmv1beta1.RolledBack, kmmv1beta1.CanaryWaiting}

// movingStates are the upgrade states of nodes whose pair moves (or should): the oldest pair state
// of each is a gauge, for the alert on a pair stuck in one state.
var movingStates = []kmmv1beta1.UpgradeState{kmmv1beta1.Upgrading, kmmv1beta1.UpgradeFailed, kmmv1beta1.RollingBack}

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
	rolloutOldestState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kmm_rollout_oldest_pair_state_timestamp_seconds",
		Help: "Per Module and upgrade state (Upgrading, UpgradeFailed, RollingBack), when the pair that has been longest in its " +
			"current state entered it (Unix seconds); absent when no node is in that upgrade state.",
	}, []string{"namespace", "module", "state"})
)

func init() {
	metrics.Registry.MustRegister(rolloutNodes, rolloutPaused, rolloutOldestState)
}

// recordMetrics sets the rollout's gauges from its status and the oldest pair state per moving
// upgrade state (nil status: the Module is not rolled out, its series go).
func recordMetrics(namespace, name string, st *kmmv1beta1.RolloutStatus, oldest map[kmmv1beta1.UpgradeState]time.Time) {
	labels := prometheus.Labels{"namespace": namespace, "module": name}
	if st == nil {
		rolloutNodes.DeletePartialMatch(labels)
		rolloutPaused.DeletePartialMatch(labels)
		rolloutOldestState.DeletePartialMatch(labels)
		return
	}
	for _, s := range movingStates {
		if t, ok := oldest[s]; ok {
			rolloutOldestState.WithLabelValues(namespace, name, string(s)).Set(float64(t.Unix()))
		} else {
			rolloutOldestState.DeleteLabelValues(namespace, name, string(s))
		}
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
