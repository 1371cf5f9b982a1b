package shared

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/retry"
)

// ConflictRetry turns a reconcile that failed only on optimistic-concurrency conflicts into a quiet
// requeue. A conflict says the object changed since it was read: the next reconcile decides on fresh
// facts. Returned as an error, controller-runtime would log each one as "Reconciler error", noise a
// user reads as a failure. The retry still backs off, per object, with client-go's exponential
// limiter (retry.BaseDelay doubling to retry.MaxDelay), forgotten on the next reconcile that ends otherwise.
type ConflictRetry struct {
	once    sync.Once
	limiter workqueue.TypedRateLimiter[ctrl.Request]
}

// Result is what a reconcile that returned res and err returns to controller-runtime: a quiet,
// backed-off requeue when err holds only conflicts, else res and err as they are.
func (c *ConflictRetry) Result(ctx context.Context, req ctrl.Request, res ctrl.Result, err error) (ctrl.Result, error) {
	c.once.Do(func() {
		c.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[ctrl.Request](retry.BaseDelay, retry.MaxDelay)
	})
	if err != nil && onlyConflicts(err) {
		after := c.limiter.When(req)
		ctrl.LoggerFrom(ctx).V(1).Info("Conflict: the object changed since it was read; retrying", "after", after, "error", err.Error())
		return ctrl.Result{RequeueAfter: after}, nil
	}
	c.limiter.Forget(req)
	return res, err
}

// onlyConflicts says whether err, and every error joined into it, is a conflict.
func onlyConflicts(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if e != nil && !onlyConflicts(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err)
}

// RefusedForGood says whether the API server refused an object for what it is (invalid, forbidden
// by policy or quota, too large), not for a passing condition (throttling, a timeout, no connection).
func RefusedForGood(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsRequestEntityTooLargeError(err)
}

// IgnoreGone drops the error of a delete or patch whose target is gone (not found) or changed
// since it was read (a conflict on its precondition): there is nothing left to do to it.
func IgnoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// PodReady says whether a pod's Ready condition is true (and it is not being deleted).
func PodReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// What upstream KMM left, as both sides recognise it (docs/migration.md, "Words").
const (
	// UpstreamWorkerActionLabel marks upstream KMM's worker pods (Load or Unload).
	UpstreamWorkerActionLabel = "kmm.node.kubernetes.io/worker-action"
	// UpstreamModuleNameLabel names the Module of an upstream worker pod, device plugin DaemonSet
	// or device plugin pod (in the object's namespace).
	UpstreamModuleNameLabel = "kmm.node.kubernetes.io/module.name"
	// UpstreamDevicePluginFinalizer is the finalizer upstream KMM puts on its device plugin pods;
	// with upstream stopped, kmm releases it once the pod is being deleted.
	UpstreamDevicePluginFinalizer = "kmm.node.kubernetes.io/node-labeler"
	// UpstreamModuleNamespaceLabel names, beside UpstreamModuleNameLabel, the Module of a
	// cluster-scoped DeviceClass upstream KMM keeps for a Module's DRA driver.
	UpstreamModuleNamespaceLabel = "kmm.node.kubernetes.io/module.namespace"
	// UpstreamRoleLabel says what an upstream DaemonSet runs; UpstreamDRARole is its value on a
	// DRA driver DaemonSet (and its pods).
	UpstreamRoleLabel = "kmm.node.kubernetes.io/role"
	UpstreamDRARole   = "dra"
)

// FieldManager is the field manager of a Module's NMC entries.
func FieldManager(namespace, name string) string {
	return "kmm-module/" + namespace + "/" + name
}

// AppliedBy says whether manager applied (server-side) something of the NMC.
func AppliedBy(nmc *kmmv1beta1.NodeModulesConfig, manager string) bool {
	if nmc == nil {
		return false
	}
	for _, mf := range nmc.ManagedFields {
		if mf.Manager == manager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.Subresource == "" {
			return true
		}
	}
	return false
}

// UpstreamDevicePluginPod says whether p is a pod of upstream KMM's device plugin: a DaemonSet's
// pod with upstream's module name label, not a worker and not kmm's.
func UpstreamDevicePluginPod(p *corev1.Pod) bool {
	if p.Labels[contract.LabelManagedBy] == contract.ManagedBy || p.Labels[UpstreamWorkerActionLabel] != "" {
		return false
	}
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.Kind == "DaemonSet" && p.Labels[UpstreamModuleNameLabel] != ""
}

// UpstreamPodSelector selects pods that carry upstream's module name label (named: one Module's).
func UpstreamPodSelector(name string) (labels.Selector, error) {
	op, values := selection.Exists, []string(nil)
	if name != "" {
		op, values = selection.Equals, []string{name}
	}
	req, err := labels.NewRequirement(UpstreamModuleNameLabel, op, values)
	if err != nil {
		return nil, err
	}
	return labels.NewSelector().Add(*req), nil
}

// ReleaseUpstreamDevicePluginPod removes upstream's finalizer from one of its device plugin pods
// being deleted (upstream is not there to do it); the pod goes once its node confirms it stopped.
func ReleaseUpstreamDevicePluginPod(ctx context.Context, c client.Client, p *corev1.Pod) error {
	var keep []string
	for _, f := range p.Finalizers {
		if f != UpstreamDevicePluginFinalizer {
			keep = append(keep, f)
		}
	}
	if len(keep) == len(p.Finalizers) {
		return nil
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": keep, "resourceVersion": p.ResourceVersion}})
	if err != nil {
		return err
	}
	return IgnoreGone(c.Patch(ctx, p, client.RawPatch(types.MergePatchType, data)))
}

// RunConcurrently runs fns, each holding a slot of sem while it runs (they start in order), and
// joins their errors.
func RunConcurrently(fns []func() error, sem chan struct{}) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
