package preflight

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/internal/retry"
	"github.com/kmm-project/kmm/internal/semantic"
	"github.com/kmm-project/kmm/preflight"
)

// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=preflightvalidations,verbs=get;list;watch
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=preflightvalidations/status,verbs=get;update;patch
// The Modules' imageRepoSecrets are read one by one, uncached, to check their images. That
// permission (get secrets) is not in the generated role: config/rbac/secret_reader_role.yaml grants
// it cluster-wide, or an administrator per Module namespace (docs/install.md, Security).

// Back-off of the re-checks of a PreflightValidation whose registries could not be reached.
const (
	PreflightRetryBase = time.Second
	PreflightRetryMax  = 5 * time.Minute
)

// Reconciler verifies every Module against the kernel of each PreflightValidation
// (preflight) and writes the verdicts to its status. Each reconcile re-checks every
// Module: a PreflightValidation is re-verified when it or a Module's spec changes, and, while a
// registry could not be reached, with back-off.
type Reconciler struct {
	Client client.Client
	// APIReader reads the Modules' pull secrets, uncached (nil: Client).
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Registry checks the images; Concurrency bounds the checks in flight per reconcile
	// (preflight.DefaultConcurrency when zero).
	Registry    preflight.Registry
	Concurrency int
	// SecretsNamespaced: the operator reads Secrets only where a RoleBinding grants it
	// (--secrets-cluster-wide=false), which a refused read's message says.
	SecretsNamespaced bool
	// Clock gives the transition times; nil means the real clock.
	Clock clock.PassiveClock

	once    sync.Once
	retries workqueue.TypedRateLimiter[ctrl.Request]
}

// SetupWithManager registers the controller: PreflightValidations (spec changes) and Modules
// (created, deleted or spec changed), each Module change enqueueing every PreflightValidation.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("preflightvalidation").
		For(&kmmv1beta2.PreflightValidation{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&kmmv1beta1.Module{}, handler.EnqueueRequestsFromMapFunc(r.allValidations),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{RateLimiter: retry.Limiter()}).
		Complete(r)
}

// allValidations lists every PreflightValidation: a Module change concerns each.
func (r *Reconciler) allValidations(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &kmmv1beta2.PreflightValidationList{}
	if err := r.Client.List(ctx, list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing PreflightValidations for a Module change")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, pv := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: pv.Name}})
	}
	return reqs
}

// Reconcile verifies every Module for one PreflightValidation.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.once.Do(func() {
		r.retries = workqueue.NewTypedItemExponentialFailureRateLimiter[ctrl.Request](PreflightRetryBase, PreflightRetryMax)
	})
	pv := &kmmv1beta2.PreflightValidation{}
	if err := r.Client.Get(ctx, req.NamespacedName, pv); err != nil {
		r.retries.Forget(req)
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("kernel", pv.Spec.KernelVersion)
	verdicts, err := preflight.Run(ctx, r.Client, preflight.Options{
		Kernel: pv.Spec.KernelVersion, Registry: r.Registry, Concurrency: r.Concurrency, Secrets: r.apiReader(),
		SecretsNamespaced: r.SecretsNamespaced, PushBuiltImage: pv.Spec.PushBuiltImage,
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	st, changed, left := preflight.Status(pv.Status, pv.Generation, verdicts, metav1.NewTime(r.clock().Now()))
	if !semantic.Equal(&pv.Status, &st) {
		log.Info("Writing the preflight verdicts", "modules", len(st.Modules), "changed", len(changed))
		pv.Status = st
		if err := r.Client.Status().Update(ctx, pv); err != nil {
			if apierrors.IsConflict(err) {
				return ctrl.Result{RequeueAfter: r.retries.When(req)}, nil
			}
			return ctrl.Result{}, err
		}
		r.emit(pv, changed, left)
	}
	for _, v := range verdicts {
		if !v.Final {
			after := r.retries.When(req)
			log.Info("A registry could not be reached: checking again", "after", after, "module", v.Key())
			return ctrl.Result{RequeueAfter: after}, nil
		}
	}
	r.retries.Forget(req)
	return ctrl.Result{}, nil
}

// emit records one Event per changed verdict on the PreflightValidation (regarding the Module too
// for a failure), and one when Modules did not fit in the status.
func (r *Reconciler) emit(pv *kmmv1beta2.PreflightValidation, changed []preflight.Verdict, left int) {
	for _, v := range changed {
		module := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: v.Namespace, Name: v.Name}}
		module.SetGroupVersionKind(kmmv1beta1.GroupVersion.WithKind("Module"))
		if v.Verified {
			r.Recorder.Eventf(pv, module, corev1.EventTypeNormal, "Preflight"+v.Reason, "Verify", "%s: %s", v.Key(), v.Message)
			continue
		}
		r.Recorder.Eventf(pv, module, corev1.EventTypeWarning, "Preflight"+v.Reason, "Verify", "%s: %s", v.Key(), v.Message)
	}
	if left > 0 {
		r.Recorder.Eventf(pv, nil, corev1.EventTypeWarning, "PreflightTruncated", "Verify",
			"%d Modules are not listed: status.modules holds at most %d", left, kmmv1beta2.MaxPreflightModules)
	}
}

func (r *Reconciler) apiReader() client.Reader {
	if r.APIReader == nil {
		return r.Client
	}
	return r.APIReader
}

func (r *Reconciler) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}
