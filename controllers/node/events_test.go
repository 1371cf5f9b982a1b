package node

import (
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// TestTransitionEventScope: the happy path's transitions are aggregated on the Module; failures,
// node happenings and a pair's last transition (its log leaves with it) stay one Event per node.
func TestTransitionEventScope(t *testing.T) {
	tr := func(trig fsm.Trigger, from, to kmmv1beta1.ModuleState) kmmv1beta1.Transition {
		return kmmv1beta1.Transition{Trigger: string(trig), From: from, To: to}
	}
	cases := []struct {
		name      string
		t         kmmv1beta1.Transition
		leftTable bool
		want      eventScope
	}{
		{"load starts", tr(fsm.SpecSet, kmmv1beta1.StateAbsent, kmmv1beta1.StateLoading), false, eventAggregated},
		{"load ends", tr(fsm.WorkerSucceeded, kmmv1beta1.StateLoading, kmmv1beta1.StateLoaded), false, eventAggregated},
		{"bump starts", tr(fsm.SpecChanged, kmmv1beta1.StateLoaded, kmmv1beta1.StateUnloading), false, eventAggregated},
		{"upgrade", tr(fsm.UpgradeRequested, kmmv1beta1.StateLoaded, kmmv1beta1.StateDevicePluginDraining), false, eventAggregated},
		{"unload ends, the pair leaves the table", tr(fsm.WorkerSucceeded, kmmv1beta1.StateUnloading, kmmv1beta1.StateAbsent), true, eventPerNode},
		{"worker failed", tr(fsm.WorkerFailed, kmmv1beta1.StateLoading, kmmv1beta1.StateLoadBackOff), false, eventFailure},
		{"worker timed out", tr(fsm.WorkerTimedOut, kmmv1beta1.StateLoading, kmmv1beta1.StateLoadBackOff), false, eventFailure},
		{"worker rejected, leaving", tr(fsm.WorkerRejected, kmmv1beta1.StateUnloading, kmmv1beta1.StateUnloadBackOff), true, eventFailure},
		{"reboot", tr(fsm.NodeRebooted, kmmv1beta1.StateLoaded, kmmv1beta1.StateLoading), false, eventPerNode},
		{"kernel change", tr(fsm.KernelChanged, kmmv1beta1.StateLoaded, kmmv1beta1.StateUnloading), false, eventPerNode},
		{"adoption", tr(fsm.Adopted, kmmv1beta1.StateAbsent, kmmv1beta1.StateLoaded), false, eventPerNode},
	}
	for _, c := range cases {
		if got := transitionEventScope(c.t, c.leftTable); got != c.want {
			t.Errorf("%s: scope %d, want %d", c.name, got, c.want)
		}
	}
}
