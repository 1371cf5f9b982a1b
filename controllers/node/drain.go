package node

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch

// drainTimeout is seed 004's failed-drain gauge: 1 while a node's upgrade drain is past its budget.
var drainTimeout = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kmm_node_drain_timeout",
	Help: "1 while an upgrade drain of the node ran every strategy, passed its timeouts, and workload pods remain.",
}, []string{"node"})

func init() {
	metrics.Registry.MustRegister(drainTimeout)
}

// drainPolicies returns the drain policy of every Module that has one.
func drainPolicies(modules []kmmv1beta1.Module) map[string]*kmmv1beta1.DrainSpec {
	out := map[string]*kmmv1beta1.DrainSpec{}
	for i := range modules {
		m := &modules[i]
		if up := m.Spec.UpgradePolicy; up != nil && up.Drain != nil && m.DeletionTimestamp.IsZero() {
			out[m.Namespace+"/"+m.Name] = up.Drain
		}
	}
	return out
}

// drainFacts reads the workload pods a pair's drain concerns, only while the pair may drain.
func (r *NMCReconciler) drainFacts(ctx context.Context, f *nodeFacts, key string, facts *fsm.Facts) (fsm.DrainFacts, error) {
	policy := f.drains[key]
	out := fsm.DrainFacts{Policy: policy, NodeCordoned: f.node.Spec.Unschedulable}
	if policy == nil || !facts.MayDrain() {
		return out, nil
	}
	sel := labels.Everything()
	if policy.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(policy.PodSelector)
		if err != nil {
			return out, err
		}
		sel = s
	}
	pods := &corev1.PodList{}
	if err := r.APIReader.List(ctx, pods, client.MatchingLabelsSelector{Selector: sel},
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", f.node.Name)}); err != nil {
		return out, err
	}
	// Pods that ended, and the pods a drain spares, are no drain's business: not even their
	// namespace's PodDisruptionBudgets are read.
	var targets []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && observeWorkload(p, nil).Spared() == "" &&
			!isOwnDRADriver(f, key, p) {
			targets = append(targets, p)
		}
	}
	pdbs, err := r.pdbsFor(ctx, targets)
	if err != nil {
		return out, err
	}
	for _, p := range targets {
		out.Pods = append(out.Pods, observeWorkload(p, pdbs))
	}
	out.Pods = append(out.Pods, ownDRADrivers(f, key)...)
	return out, nil
}

// observeWorkload turns a pod the drain's podSelector selects into the facts the drain plan reads,
// among them what makes a drain spare it (fsm.WorkloadPod.Spared): kmm's own pod, a static pod's
// mirror, a DaemonSet's pod.
func observeWorkload(p *corev1.Pod, pdbs []policyv1.PodDisruptionBudget) fsm.WorkloadPod {
	_, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]
	owner := metav1.GetControllerOf(p)
	return fsm.WorkloadPod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
		PDBProtected: protected(p, pdbs), Terminating: p.DeletionTimestamp != nil, Finalizers: len(p.Finalizers) > 0,
		CreatedByKMM: contract.CreatedByKMM(p.Labels), Mirror: mirror, DaemonSet: owner != nil && owner.Kind == "DaemonSet"}
}

func (r *NMCReconciler) pdbsFor(ctx context.Context, pods []*corev1.Pod) ([]policyv1.PodDisruptionBudget, error) {
	seen := map[string]bool{}
	var out []policyv1.PodDisruptionBudget
	for _, p := range pods {
		if seen[p.Namespace] {
			continue
		}
		seen[p.Namespace] = true
		list := &policyv1.PodDisruptionBudgetList{}
		if err := r.APIReader.List(ctx, list, client.InNamespace(p.Namespace)); err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
	}
	return out, nil
}

func protected(p *corev1.Pod, pdbs []policyv1.PodDisruptionBudget) bool {
	for _, pdb := range pdbs {
		if pdb.Namespace != p.Namespace || pdb.Spec.Selector == nil {
			continue
		}
		if s, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err == nil && s.Matches(labels.Set(p.Labels)) {
			return true
		}
	}
	return false
}

// executeDrain carries out a pair's drain plan: cordon, evictions, the escalations (an Event per
// escalation per pod), uncordon, and the drain-timeout gauge.
func (r *NMCReconciler) executeDrain(ctx context.Context, f *nodeFacts, key string, p fsm.Plan) error {
	if p.Uncordon {
		return r.setUnschedulable(ctx, f, false)
	}
	d := p.Drain
	if d == nil {
		return nil
	}
	var errs []error
	if d.Cordon {
		errs = append(errs, r.setUnschedulable(ctx, f, true))
	}
	for _, w := range d.Evict {
		errs = append(errs, r.evict(ctx, w))
	}
	for _, w := range d.Delete {
		r.escalationEvent(f, key, w, "Deleted", d.Strategy)
		errs = append(errs, shared.IgnoreGone(r.Client.Delete(ctx, workloadPod(w), client.Preconditions{UID: uidOf(w)})))
	}
	for _, w := range d.StripFinalizers {
		r.escalationEvent(f, key, w, "StrippedFinalizers", d.Strategy)
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		errs = append(errs, shared.IgnoreGone(r.Client.Patch(ctx, workloadPod(w), patch)))
	}
	return errors.Join(errs...)
}

// setDrainGauge sets kmm_node_drain_timeout for the node from this reconcile's drain plans.
func setDrainGauge(node string, outcomes []pairOutcome) {
	v := 0.0
	for _, o := range outcomes {
		if d := o.result.Plan.Drain; d != nil && d.TimedOut {
			v = 1
		}
	}
	drainTimeout.WithLabelValues(node).Set(v)
}

// evict asks the Eviction API to evict a pod; a PodDisruptionBudget refusal (429) is expected.
func (r *NMCReconciler) evict(ctx context.Context, w fsm.WorkloadPod) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: w.Name}}
	err := r.Client.SubResource("eviction").Create(ctx, workloadPod(w), ev)
	if apierrors.IsTooManyRequests(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (r *NMCReconciler) escalationEvent(f *nodeFacts, key string, w fsm.WorkloadPod, action, strategy string) {
	note := fmt.Sprintf("drain of %s for %s: %s pod %s/%s (strategy %s)", f.node.Name, key, strings.ToLower(action), w.Namespace, w.Name, strategy)
	r.Recorder.Eventf(workloadPod(w), f.nmc, corev1.EventTypeWarning, "Drain"+action, strategy, note)
}

func (r *NMCReconciler) setUnschedulable(ctx context.Context, f *nodeFacts, cordon bool) error {
	if f.node.Spec.Unschedulable == cordon {
		return nil
	}
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, cordon)
	return r.Client.Patch(ctx, f.writableNode(), client.RawPatch(types.MergePatchType, []byte(patch)))
}

func workloadPod(w fsm.WorkloadPod) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: w.Name, UID: types.UID(w.UID)}}
}

func uidOf(w fsm.WorkloadPod) *types.UID {
	u := types.UID(w.UID)
	return &u
}
