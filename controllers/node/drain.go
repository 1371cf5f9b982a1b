package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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

// drainFacts reads the workload pods a pair's drain concerns, only while the pair may drain: the
// pods on the node its podSelector selects (listed with that selector), or, with deviceUsers, every
// pod on the node (one list per reconcile, whatever the number of pairs) of which fsm.Concerns
// keeps the selected ones and those that use the Module's devices.
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
	pods, err := r.drainCandidates(ctx, f, policy, sel)
	if err != nil {
		return out, err
	}
	holders := claimHolders(f, key, policy)
	// Pods that ended, and the pods a drain spares or does not concern, are no drain's business:
	// not even their namespace's PodDisruptionBudgets are read.
	var targets []*corev1.Pod
	var observed []fsm.WorkloadPod
	for _, p := range pods {
		w := observeCandidate(p, policy, sel, holders)
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && w.Spared() == "" &&
			!isOwnDRADriver(f, key, p) && fsm.Concerns(policy, w) {
			targets, observed = append(targets, p), append(observed, w)
		}
	}
	pdbs, err := r.pdbsFor(ctx, targets)
	if err != nil {
		return out, err
	}
	for i, p := range targets {
		observed[i].PDBProtected = protected(p, pdbs)
	}
	out.Pods = append(observed, ownDRADrivers(f, key)...)
	return out, nil
}

// drainCandidates lists the pods on the node a drain may concern: those the podSelector selects,
// or every pod on the node with deviceUsers (read once per reconcile and kept in f.nodePods).
// Either is one list of the node's pods by spec.nodeName from the API server, never a cluster-wide
// one: at most the node's pod capacity (110 by default).
func (r *NMCReconciler) drainCandidates(ctx context.Context, f *nodeFacts, policy *kmmv1beta1.DrainSpec, sel labels.Selector) ([]*corev1.Pod, error) {
	onNode := client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", f.node.Name)}
	if policy.DeviceUsers == nil {
		pods := &corev1.PodList{}
		if err := r.APIReader.List(ctx, pods, client.MatchingLabelsSelector{Selector: sel}, onNode); err != nil {
			return nil, err
		}
		return podPointers(pods.Items), nil
	}
	if f.nodePods == nil {
		pods := &corev1.PodList{}
		if err := r.APIReader.List(ctx, pods, onNode); err != nil {
			return nil, err
		}
		f.nodePods = podPointers(pods.Items)
	}
	return f.nodePods, nil
}

func podPointers(items []corev1.Pod) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(items))
	for i := range items {
		out = append(out, &items[i])
	}
	return out
}

// observeCandidate is observeWorkload plus what a drain with deviceUsers and jobs reads: whether
// the podSelector misses the pod, the resources it requests, whether it holds a claim of the
// Module's DRA driver.
func observeCandidate(p *corev1.Pod, policy *kmmv1beta1.DrainSpec, sel labels.Selector, holders claimHolderSet) fsm.WorkloadPod {
	w := observeWorkload(p, nil)
	w.OutsideSelector = policy.PodSelector != nil && !sel.Matches(labels.Set(p.Labels))
	if du := policy.DeviceUsers; du != nil {
		w.Resources = podResources(p, du.ExtendedResources)
		w.HoldsClaim = du.ResourceClaims && holders.holds(p)
	}
	return w
}

// podResources are the resource names the pod's containers (init containers included) request or
// limit: the ones listed first, then the others, each sorted, at most fsm.MaxPodResources.
func podResources(p *corev1.Pod, listed []string) []string {
	seen := map[string]bool{}
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for name := range c.Resources.Requests {
			seen[string(name)] = true
		}
		for name := range c.Resources.Limits {
			seen[string(name)] = true
		}
	}
	var first, rest []string
	for _, name := range slices.Sorted(maps.Keys(seen)) {
		if slices.Contains(listed, name) {
			first = append(first, name)
		} else {
			rest = append(rest, name)
		}
	}
	out := append(first, rest...)
	return out[:min(len(out), fsm.MaxPodResources)]
}

// claimHolderSet are the pods that ResourceClaims allocated on the node with the Module's DRA
// driver's devices are reserved for (by UID), and those claims' names ("namespace/name").
type claimHolderSet struct {
	uids   map[types.UID]bool
	claims map[string]bool
}

// claimHolders reads them from the ResourceClaims this reconcile read already (f.claims: read for
// a Module with a DRA driver whose pair may unload, as a pair that may drain may, but after a first
// load, when the driver cannot be on the node yet): no other list.
func claimHolders(f *nodeFacts, key string, policy *kmmv1beta1.DrainSpec) claimHolderSet {
	out := claimHolderSet{uids: map[types.UID]bool{}, claims: map[string]bool{}}
	driver := f.drivers[key]
	if policy.DeviceUsers == nil || !policy.DeviceUsers.ResourceClaims || driver == "" {
		return out
	}
	for i := range f.claims {
		c := &f.claims[i]
		if !fsm.ClaimHoldsNode(c, driver, f.node.Name, f.node.Labels) {
			continue
		}
		out.claims[c.Namespace+"/"+c.Name] = true
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" && ref.APIGroup == "" {
				out.uids[ref.UID] = true
			}
		}
	}
	return out
}

// holds says whether one of the claims is reserved for the pod or named by it.
func (s claimHolderSet) holds(p *corev1.Pod) bool {
	if s.uids[p.UID] {
		return true
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil && s.claims[p.Namespace+"/"+*st.ResourceClaimName] {
			return true
		}
	}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil && s.claims[p.Namespace+"/"+*rc.ResourceClaimName] {
			return true
		}
	}
	return false
}

// observeWorkload turns a pod on the node into the facts the drain plan reads, among them what
// makes a drain spare it (fsm.WorkloadPod.Spared): kmm's own pod, a static pod's mirror, a
// DaemonSet's pod; and whether a Job controls it.
func observeWorkload(p *corev1.Pod, pdbs []policyv1.PodDisruptionBudget) fsm.WorkloadPod {
	_, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]
	owner := metav1.GetControllerOf(p)
	return fsm.WorkloadPod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
		PDBProtected: protected(p, pdbs), Terminating: p.DeletionTimestamp != nil, Finalizers: len(p.Finalizers) > 0,
		CreatedByKMM: contract.CreatedByKMM(p.Labels), Mirror: mirror, DaemonSet: owner != nil && owner.Kind == "DaemonSet",
		Job: owner != nil && owner.Kind == "Job" && strings.HasPrefix(owner.APIVersion, "batch/")}
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
