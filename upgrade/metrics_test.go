package upgrade

import (
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestRolloutMetrics checks the gauges a rollout status sets, their removal with the Module, and
// that config/prometheus's alerts on the rollout name these gauges with labels they have.
func TestRolloutMetrics(t *testing.T) {
	st := &kmmv1beta1.RolloutStatus{Version: "v2",
		NodesByUpgradeState: map[kmmv1beta1.UpgradeState]int32{kmmv1beta1.UpgradeFailed: 2, kmmv1beta1.Upgraded: 3},
		Paused:              &kmmv1beta1.RolloutPause{Reason: kmmv1beta1.ReasonFailureBudgetExceeded}}
	stuck := time.Unix(1_800_000_000, 0)
	recordMetrics("ns", "m", st, map[kmmv1beta1.UpgradeState]time.Time{kmmv1beta1.UpgradeFailed: stuck})
	if got := testutil.ToFloat64(rolloutOldestState.WithLabelValues("ns", "m", string(kmmv1beta1.UpgradeFailed))); got != float64(stuck.Unix()) {
		t.Fatalf("kmm_rollout_oldest_pair_state_timestamp_seconds{state=UpgradeFailed} = %v, want %d", got, stuck.Unix())
	}
	if n := testutil.CollectAndCount(rolloutOldestState); n != 1 {
		t.Fatalf("%d oldest-state series, want only UpgradeFailed's", n)
	}
	if got := testutil.ToFloat64(rolloutNodes.WithLabelValues("ns", "m", string(kmmv1beta1.UpgradeFailed))); got != 2 {
		t.Fatalf("kmm_rollout_nodes{state=UpgradeFailed} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(rolloutNodes.WithLabelValues("ns", "m", string(kmmv1beta1.UpgradePending))); got != 0 {
		t.Fatalf("kmm_rollout_nodes{state=UpgradePending} = %v, want 0 (set, not missing)", got)
	}
	if got := testutil.ToFloat64(rolloutPaused.WithLabelValues("ns", "m", kmmv1beta1.ReasonFailureBudgetExceeded)); got != 1 {
		t.Fatalf("kmm_rollout_paused{reason=FailureBudgetExceeded} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(rolloutPaused.WithLabelValues("ns", "m", kmmv1beta1.ReasonPausedByUser)); got != 0 {
		t.Fatalf("kmm_rollout_paused{reason=PausedByUser} = %v, want 0", got)
	}
	recordMetrics("ns", "m", nil, nil)
	if n := testutil.CollectAndCount(rolloutNodes) + testutil.CollectAndCount(rolloutPaused) + testutil.CollectAndCount(rolloutOldestState); n != 0 {
		t.Fatalf("%d series left after the Module went", n)
	}

	data, err := os.ReadFile("../config/prometheus/rule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct{ Alert, Expr string }
			}
		}
	}
	if err := yaml.Unmarshal(data, &rule); err != nil {
		t.Fatal(err)
	}
	known := map[string]map[string]bool{
		"kmm_rollout_nodes":  {"state": true, "namespace": true, "module": true},
		"kmm_rollout_paused": {"reason": true, "namespace": true, "module": true},
		"kmm_rollout_oldest_pair_state_timestamp_seconds": {"state": true, "namespace": true, "module": true},
	}
	alerts := 0
	series := regexp.MustCompile(`(kmm_rollout_\w+)(\{([^}]*)\})?`)
	label := regexp.MustCompile(`(\w+)=~?"`)
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			for _, m := range series.FindAllStringSubmatch(r.Expr, -1) {
				alerts++
				if known[m[1]] == nil {
					t.Errorf("alert %s uses %s, which the rollout does not export", r.Alert, m[1])
				}
				for _, l := range label.FindAllStringSubmatch(m[3], -1) {
					if !known[m[1]][l[1]] {
						t.Errorf("alert %s selects %s{%s}, a label it does not have", r.Alert, m[1], l[1])
					}
				}
			}
		}
	}
	if alerts < 3 {
		t.Fatalf("config/prometheus/rule.yaml alerts on %d rollout series, want the pause, the failed nodes and a pair stuck", alerts)
	}
}
