package node

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
)

// record counts a metric for every transition and emits its Event where transitionEventScope puts
// it: failures (and a drain's Job wait that ran out, JobWaitExpired), node happenings and a pair's
// last transition once per node on the NMC (those Warnings on the Module too); the happy path's transitions once per Module, reason and target state, which
// the event broadcaster folds into one Event series (its count is the number of transitions). The
// NMC's transition log (kubectl kmm history) keeps every transition of every pair.
func (r *NMCReconciler) record(f *nodeFacts, outcomes []pairOutcome) {
	for _, o := range outcomes {
		var module *kmmv1beta1.Module
		if len(o.result.Fired) > 0 {
			ns, name, _ := strings.Cut(o.key, "/")
			module = &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		}
		for _, t := range o.result.Fired {
			transitionsTotal.WithLabelValues(string(t.From), string(t.To), t.Trigger).Inc()
			switch transitionEventScope(t, o.result.Status == nil) {
			case eventAggregated:
				note := fmt.Sprintf("%s: %s -> %s (%s) on a node; the series counts them, `kubectl kmm history <node>` lists each",
					o.key, t.From, t.To, t.Trigger)
				r.Recorder.Eventf(module, nil, corev1.EventTypeNormal, t.Reason, "To"+string(t.To), note)
				continue
			case eventFailure:
				note := transitionNote(o, f.node.Name, t)
				r.Recorder.Eventf(f.nmc, module, corev1.EventTypeWarning, t.Reason, "Transition", note)
				r.Recorder.Eventf(module, f.nmc, corev1.EventTypeWarning, t.Reason, "Transition", note)
			default:
				r.Recorder.Eventf(f.nmc, module, corev1.EventTypeNormal, t.Reason, "Transition", transitionNote(o, f.node.Name, t))
			}
		}
		if o.pod != nil && o.result.Plan.DeleteWorker {
			observeFinishedPod(o.pod, o.worker)
		}
	}
}

// transitionNote is the note of a per-node transition Event: the message of the step's last
// transition (the status entry may be gone, nil, when the pair left the table).
func transitionNote(o pairOutcome, node string, t kmmv1beta1.Transition) string {
	return fmt.Sprintf("%s on %s: %s -> %s (%s)", o.key, node, t.From, t.To, o.result.Message)
}

// eventScope says where a transition's Event goes.
type eventScope int

const (
	// eventPerNode: a Normal Event on the NMC, one per transition.
	eventPerNode eventScope = iota
	// eventFailure: a Warning Event on the NMC and one on the Module, one per transition.
	eventFailure
	// eventAggregated: a Normal Event on the Module, one series per Module, reason and target
	// state (issue 22: Events off the happy path).
	eventAggregated
)

// transitionEventScope decides where the Event of transition t goes; leftTable says the pair has
// no status entry after the step, so its transition log went with it. Per node: failures, what
// happened to the node rather than to the Module (a reboot, a kernel change, an adoption from
// upstream), and a pair's last transition. Aggregated: the rest, the happy path of a load, an
// unload, a bump and an upgrade, which the pair's transition log keeps.
func transitionEventScope(t kmmv1beta1.Transition, leftTable bool) eventScope {
	switch trig := fsm.Trigger(t.Trigger); {
	case fsm.IsWarning(trig):
		return eventFailure
	case leftTable, trig == fsm.NodeRebooted, trig == fsm.KernelChanged, trig == fsm.Adopted:
		return eventPerNode
	}
	return eventAggregated
}

// observeFinishedPod counts a finished worker pod; w is the pod as ObserveWorker read it.
func observeFinishedPod(p *corev1.Pod, w fsm.Worker) {
	action, outcome := p.Labels[contract.LabelAction], string(p.Status.Phase)
	if d, ok := workerDuration(p); ok {
		workerPodDuration.WithLabelValues(action, outcome).Observe(d.Seconds())
	}
	if p.Status.Phase == corev1.PodFailed {
		workerFailuresTotal.WithLabelValues(action, string(w.Result.Reason)).Inc()
	}
}

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
