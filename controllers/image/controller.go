package image

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
	"github.com/kmm-project/kmm/internal/retry"
	"github.com/kmm-project/kmm/internal/semantic"
	"github.com/kmm-project/kmm/preflight"
)

// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=moduleimagesconfigs,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=moduleimagesconfigs/status,verbs=get;update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get
// +kubebuilder:rbac:groups=kmm.sigs.x-k8s.io,resources=preflightvalidations,verbs=get;list;watch

// Reconciler is the image controller: one reconcile per Module (the MIC has the Module's name).
type Reconciler struct {
	Client client.Client
	// APIReader reads what the cache does not hold: the recipe's ConfigMap and Secrets, the pull
	// secret (one GET each, only when a check or a pod needs them).
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Clock is the machine's time; nil means the real clock.
	Clock clock.PassiveClock
	// Registry checks whether an image exists (one manifest HEAD, bounded by its Timeout).
	Registry preflight.Registry
	// WorkerImage runs `worker sign` in sign pods; BuilderImage runs the build pods.
	WorkerImage, BuilderImage string
	// RegistrySettings are the worker pods' registry settings (mirrors, CAs, credential
	// providers): sign and build pods take the same, and the check reads what of them the operator
	// can read itself (registrySettings).
	RegistrySettings shared.RegistryOptions
}

func (r *Reconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// SetupWithManager watches Modules, their MICs and build and sign pods, and Nodes (a kernel or a
// label change changes the images the Module's nodes need).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("image").
		For(&kmmv1beta1.Module{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, deletionStarted()))).
		Watches(&kmmv1beta1.ModuleImagesConfig{}, handler.EnqueueRequestsFromMapFunc(sameName)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podModule)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.modulesWithRecipe), builder.WithPredicates(nodeKernelOrLabels())).
		Watches(&kmmv1beta2.PreflightValidation{}, handler.EnqueueRequestsFromMapFunc(r.modulesWithRecipe)).
		WithOptions(controller.Options{RateLimiter: retry.Limiter()}).
		Complete(r)
}

// deletionStarted passes the update that marks a Module deleted: its builds are cancelled at once.
func deletionStarted() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
}

func sameName(_ context.Context, o client.Object) []ctrl.Request {
	return []ctrl.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
}

// podModule is the Module of a build or sign pod (none for other pods).
func podModule(_ context.Context, o client.Object) []ctrl.Request {
	l := o.GetLabels()
	if l[LabelImageJob] == "" {
		return nil
	}
	for _, ref := range o.GetOwnerReferences() {
		if ref.Kind == "Module" {
			return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: ref.Name}}}
		}
	}
	return nil
}

// modulesWithRecipe are the Modules with a build or sign, for a Node event.
func (r *Reconciler) modulesWithRecipe(ctx context.Context, _ client.Object) []ctrl.Request {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.Client.List(ctx, modules, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	var out []ctrl.Request
	for i := range modules.Items {
		if mapping.HasRecipe(&modules.Items[i]) {
			out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&modules.Items[i])})
		}
	}
	return out
}

func nodeKernelOrLabels() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !maps.Equal(o.Labels, n.Labels) || o.Status.NodeInfo.KernelVersion != n.Status.NodeInfo.KernelVersion
	}}
}

// Reconcile keeps the Module's MIC and runs the image machine on each of its images.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("module", req.String())
	m := &kmmv1beta1.Module{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err) // the garbage collector takes its MIC and pods
	}
	pods, err := r.pods(ctx, m)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !m.DeletionTimestamp.IsZero() || !mapping.HasRecipe(m) {
		// A deleted Module cancels its builds and signs; one without a recipe has nothing to make.
		return ctrl.Result{}, r.cleanUp(ctx, m, pods, log)
	}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	ahead, err := r.aheadKernels(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	mic, err := r.syncSpec(ctx, m, desiredSpec(m, nodes.Items, ahead))
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.step(ctx, m, mic, pods, log)
}

// aheadKernels are the target kernels of the PreflightValidations with pushBuiltImage (issue 37
// item 5: images built ahead of a kernel upgrade).
func (r *Reconciler) aheadKernels(ctx context.Context) ([]string, error) {
	list := &kmmv1beta2.PreflightValidationList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, err
	}
	var out []string
	for _, pv := range list.Items {
		if pv.Spec.PushBuiltImage && pv.DeletionTimestamp.IsZero() {
			out = append(out, pv.Spec.KernelVersion)
		}
	}
	return out, nil
}

// pods lists the Module's build and sign pods (from the cache: kmm's pods carry its label).
func (r *Reconciler) pods(ctx context.Context, m *kmmv1beta1.Module) ([]corev1.Pod, error) {
	list := &corev1.PodList{}
	err := r.Client.List(ctx, list, client.InNamespace(m.Namespace), client.MatchingLabels{
		contract.LabelManagedBy: contract.ManagedBy, contract.LabelModuleName: contract.Bounded(m.Name, contract.MaxLabelValue)},
		client.HasLabels{LabelImageJob})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if metav1.IsControlledBy(&p, m) {
			out = append(out, p)
		}
	}
	return out, nil
}

// cleanUp deletes every build and sign pod of m and, for a Module without a recipe, the MIC kmm
// made for it (labelled; one upstream KMM left for a Module without a recipe stays as it is).
func (r *Reconciler) cleanUp(ctx context.Context, m *kmmv1beta1.Module, pods []corev1.Pod, log logr.Logger) error {
	var errs []error
	for i := range pods {
		if pods[i].DeletionTimestamp.IsZero() {
			log.Info("Deleting a build or sign pod", "pod", pods[i].Name, "deleting", !m.DeletionTimestamp.IsZero())
			errs = append(errs, r.deletePod(ctx, &pods[i]))
		}
	}
	if m.DeletionTimestamp.IsZero() {
		mic := &kmmv1beta1.ModuleImagesConfig{}
		err := r.Client.Get(ctx, client.ObjectKeyFromObject(m), mic)
		switch {
		case err != nil:
			errs = append(errs, client.IgnoreNotFound(err))
		case contract.CreatedByKMM(mic.Labels):
			uid := mic.UID
			errs = append(errs, client.IgnoreNotFound(r.Client.Delete(ctx, mic, client.Preconditions{UID: &uid})))
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) deletePod(ctx context.Context, p *corev1.Pod) error {
	uid := p.UID
	return client.IgnoreNotFound(r.Client.Delete(ctx, p, client.Preconditions{UID: &uid}))
}

// syncSpec creates the MIC of m, owned by it and labelled as kmm's, or updates its spec to want
// (taking over one upstream KMM left: labelled, its entries checked again by the machine).
func (r *Reconciler) syncSpec(ctx context.Context, m *kmmv1beta1.Module, want kmmv1beta1.ModuleImagesConfigSpec) (*kmmv1beta1.ModuleImagesConfig, error) {
	mic := &kmmv1beta1.ModuleImagesConfig{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(m), mic)
	switch {
	case apierrors.IsNotFound(err):
		mic = &kmmv1beta1.ModuleImagesConfig{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name,
			Labels: map[string]string{contract.LabelManagedBy: contract.ManagedBy}, OwnerReferences: []metav1.OwnerReference{owner(m)}}, Spec: want}
		return mic, r.Client.Create(ctx, mic)
	case err != nil:
		return nil, err
	case semantic.Equal(&mic.Spec, &want) && contract.CreatedByKMM(mic.Labels):
		return mic, nil
	}
	mic.Spec = want
	if mic.Labels == nil {
		mic.Labels = map[string]string{}
	}
	mic.Labels[contract.LabelManagedBy] = contract.ManagedBy
	return mic, r.Client.Update(ctx, mic)
}

// decision is the machine's result for one image, with what the controller needs to act on it.
type decision struct {
	spec  *kmmv1beta1.ModuleImageSpec
	res   image.Result
	fired []kmmv1beta1.ImageTransition
	// pods are the image's existing pods by kind and run.
	pods map[image.PodRef]*corev1.Pod
	// prevReason is the entry's reason before the step (a registry error is reported once per check).
	registryError bool
}

// step decides every image, writes the MIC status once, then acts: Events for failures, pods
// deleted and created. It requeues at the earliest time a machine asked for.
func (r *Reconciler) step(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, pods []corev1.Pod, log logr.Logger) (ctrl.Result, error) {
	byImage := podsByImage(pods)
	decisions := make([]decision, 0, len(mic.Spec.Images))
	status := kmmv1beta1.ModuleImagesConfigStatus{ImageRebuildTriggerGeneration: mic.Status.ImageRebuildTriggerGeneration}
	for i := range mic.Spec.Images {
		d := r.decide(ctx, m, mic, &mic.Spec.Images[i], byImage[imageHash(mic.Spec.Images[i].Image)])
		decisions = append(decisions, d)
		status.ImagesStates = append(status.ImagesStates, d.res.Status)
	}
	if !semantic.Equal(&mic.Status, &status) {
		mic.Status = status
		if err := r.Client.Status().Update(ctx, mic); err != nil {
			return ctrl.Result{}, err // a conflict: decided on stale data, decided again
		}
	}
	var errs []error
	var requeue time.Duration
	for i := range decisions {
		errs = append(errs, r.act(ctx, m, mic, &decisions[i], log))
		if after := decisions[i].res.Plan.RequeueAfter; after > 0 && (requeue == 0 || after < requeue) {
			requeue = after
		}
	}
	// Pods of images no longer in the spec: a finished one goes; a running one finishes first.
	for hash, ps := range byImage {
		if !specHas(mic, hash) {
			for _, p := range ps {
				if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
					errs = append(errs, r.deletePod(ctx, p))
				}
			}
		}
	}
	return ctrl.Result{RequeueAfter: requeue}, errors.Join(errs...)
}

func specHas(mic *kmmv1beta1.ModuleImagesConfig, hash string) bool {
	for i := range mic.Spec.Images {
		if imageHash(mic.Spec.Images[i].Image) == hash {
			return true
		}
	}
	return false
}

// podsByImage files pods by the hash of the image they make.
func podsByImage(pods []corev1.Pod) map[string][]*corev1.Pod {
	out := map[string][]*corev1.Pod{}
	for i := range pods {
		h := pods[i].Labels[LabelImageHash]
		out[h] = append(out[h], &pods[i])
	}
	return out
}

// maxRounds bounds the Steps of one decision: a registry answer, then a run that cannot start.
const maxRounds = 3

// decide runs the machine for one image: Step, and again with the registry's answer when it
// asks for one, and again with a failed run when the pod it plans cannot start (its ConfigMap or
// a Secret is missing): such a run fails like a failed pod, with back-off, and no pod is created.
func (r *Reconciler) decide(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec, pods []*corev1.Pod) decision {
	d := decision{spec: e, pods: map[image.PodRef]*corev1.Pod{}}
	f := image.Facts{Now: r.now(), Image: e.Image, Recipe: image.Recipe{Build: e.Build != nil, Sign: e.Sign != nil},
		Generation: mic.Spec.ImageRebuildTriggerGeneration}
	if prev := mic.ImageStateEntry(e.Image); prev != nil {
		f.Status = *prev
	}
	for _, p := range pods {
		fact, ok := podFact(p)
		if !ok {
			continue
		}
		kind := image.PodKind(p.Labels[LabelImageJob])
		d.pods[image.PodRef{Kind: kind, Run: fact.Run}] = p
		switch kind {
		case image.BuildPod:
			f.BuildPods = append(f.BuildPods, fact)
		case image.SignPod:
			f.SignPods = append(f.SignPods, fact)
		}
	}
	d.res = image.Step(f)
	d.fired = d.res.Fired
	for range maxRounds {
		next := f
		next.Status, next.Registry = d.res.Status, nil
		switch plan := d.res.Plan; {
		case plan.CheckRegistry:
			ans := r.check(ctx, m, mic, e)
			next.Registry = &ans
			d.registryError = ans.Answer == image.AnswerError
		case plan.CreatePod != nil:
			msg := r.missingInput(ctx, m, mic, e, plan.CreatePod.Kind)
			if msg == "" {
				return d
			}
			failed := image.Pod{Run: plan.CreatePod.Run, Phase: image.PodFailed, Message: msg}
			if plan.CreatePod.Kind == image.BuildPod {
				next.BuildPods = append(next.BuildPods, failed)
			} else {
				next.SignPods = append(next.SignPods, failed)
			}
		default:
			return d
		}
		f = next
		d.res = image.Step(f)
		d.fired = append(d.fired, d.res.Fired...)
	}
	return d
}

// act carries out one image's plan after the status was written: one Event per failure, finished
// pods deleted, the pod of the current run created.
func (r *Reconciler) act(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, d *decision, log logr.Logger) error {
	for _, tr := range d.fired {
		if image.IsFailure(image.Trigger(tr.Trigger)) {
			r.warn(m, tr.Trigger, fmt.Sprintf("image %s: %s", d.spec.Image, d.res.Status.Message))
		}
	}
	if d.registryError {
		r.warn(m, image.ReasonRegistryUnreachable, fmt.Sprintf("image %s: %s", d.spec.Image, d.res.Status.Message))
	}
	var errs []error
	for _, ref := range d.res.Plan.DeletePods {
		if p := d.pods[ref]; p != nil && p.DeletionTimestamp.IsZero() {
			errs = append(errs, r.deletePod(ctx, p))
		}
	}
	if in := d.res.Plan.CreatePod; in != nil {
		errs = append(errs, r.createPod(ctx, m, mic, d.spec, in, log))
	}
	return errors.Join(errs...)
}

// maxEventNote is the API's bound on an Event's note.
const maxEventNote = 1024

func (r *Reconciler) warn(m *kmmv1beta1.Module, reason, note string) {
	if r.Recorder == nil {
		return
	}
	if len(note) > maxEventNote {
		note = "…" + note[len(note)-maxEventNote+len("…"):]
	}
	r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, reason, "Image", "%s", note)
}

// createPod creates the build or sign pod of a run; an existing one (same name) is left alone.
func (r *Reconciler) createPod(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec, in *image.PodIntent, log logr.Logger) error {
	var pod *corev1.Pod
	sa, err := shared.ServiceAccountPullSecrets(ctx, r.reader(), m.Namespace, serviceAccount(m))
	if err != nil {
		return err // retried with back-off; the pod would pull and push without them
	}
	reg := r.RegistrySettings.Pod(sa)
	if in.Kind == image.BuildPod {
		pod, err = build.Pod(buildRequest(m, mic, e, in.Run, r.BuilderImage, reg))
	} else {
		pod, err = signPod(m, mic, e, in.Run, r.WorkerImage, reg)
	}
	if err != nil {
		return err
	}
	log.Info("Creating an image pod", "kind", in.Kind, "run", in.Run, "image", e.Image, "pod", pod.Name)
	if err := r.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the %s pod of %s: %w", in.Kind, e.Image, err)
	}
	return nil
}
