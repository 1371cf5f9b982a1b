package image

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/preflight"
)

func (r *Reconciler) reader() client.Reader {
	if r.APIReader == nil {
		return r.Client
	}
	return r.APIReader
}

// check asks the image's registry whether the image exists (one manifest HEAD per endpoint, all
// bounded by the Registry's timeout), at the endpoints the registry settings give for it (mirrors
// first, registrySettings), with the Module's pull secret and its service account's. A refused or
// absent pull secret, unreadable settings, a denial and no answer are all an error, which the
// machine retries with back-off.
func (r *Reconciler) check(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec) image.RegistryAnswer {
	kc, err := r.checkKeychain(ctx, m, mic)
	if err != nil {
		return image.RegistryAnswer{Answer: image.AnswerError, Message: err.Error()}
	}
	settings, trust, err := r.registrySettings(ctx, m.Namespace)
	if err != nil {
		return image.RegistryAnswer{Answer: image.AnswerError, Message: err.Error()}
	}
	var tls kmmv1beta1.TLSOptions
	if e.RegistryTLS != nil {
		tls = *e.RegistryTLS
	}
	res := checkEndpoints(ctx, r.Registry, e.Image, tls, settings, trust, kc)
	switch res.Outcome {
	case preflight.Found:
		return image.RegistryAnswer{Answer: image.AnswerPresent}
	case preflight.NotFound:
		return image.RegistryAnswer{Answer: image.AnswerMissing, Message: res.Detail}
	}
	return image.RegistryAnswer{Answer: image.AnswerError, Message: fmt.Sprintf("%s: %s", res.Outcome, res.Detail)}
}

// checkKeychain is the credentials of the check, as the worker's: the Module's imageRepoSecret,
// then its service account's imagePullSecrets (at most shared.MaxServiceAccountPullSecrets; one
// that does not exist is skipped, as the pod's optional projection skips it).
func (r *Reconciler) checkKeychain(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig) (authn.Keychain, error) {
	var pull []corev1.Secret
	if ps := mic.Spec.ImageRepoSecret; ps != nil {
		s := &corev1.Secret{}
		if err := r.reader().Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ps.Name}, s); err != nil {
			return nil, fmt.Errorf("reading the imageRepoSecret %s: %w", ps.Name, err)
		}
		pull = append(pull, *s)
	}
	names, err := shared.ServiceAccountPullSecrets(ctx, r.reader(), m.Namespace, serviceAccount(m))
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		s := &corev1.Secret{}
		err := r.reader().Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: n}, s)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("reading the service account's pull secret %s: %w", n, err)
		}
		pull = append(pull, *s)
	}
	kc, err := kauth.NewFromPullSecrets(ctx, pull)
	if err != nil {
		return nil, fmt.Errorf("the imageRepoSecret is not a pull secret: %w", err)
	}
	return kc, nil
}

// serviceAccount is the service account of m's worker pods, whose pull secrets the pods of its
// images use too ("" for the namespace's default).
func serviceAccount(m *kmmv1beta1.Module) string {
	if m.Spec.ModuleLoader == nil {
		return ""
	}
	return m.Spec.ModuleLoader.ServiceAccountName
}

// missingInput says why the pod of kind cannot start ("" when it can): its ConfigMap (with the key
// "dockerfile"), a Secret it mounts (with the key it reads), or a recipe the pod cannot be made
// from. Such a pod would wait in ContainerCreating until its deadline; the run fails at once instead.
func (r *Reconciler) missingInput(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec, kind image.PodKind) string {
	var err error
	if kind == image.BuildPod {
		_, err = build.Pod(buildRequest(m, mic, e, 0, r.BuilderImage, shared.RegistryPod{}))
	} else {
		_, err = signPod(m, mic, e, 0, r.WorkerImage, shared.RegistryPod{})
	}
	if err != nil {
		return err.Error()
	}
	type need struct {
		what, name, key string
		secret          bool
	}
	var needs []need
	if ps := mic.Spec.ImageRepoSecret; ps != nil {
		needs = append(needs, need{"imageRepoSecret", ps.Name, corev1.DockerConfigJsonKey, true})
	}
	if kind == image.BuildPod {
		needs = append(needs, need{"build.dockerfileConfigMap", e.Build.DockerfileConfigMap.Name, build.DockerfileKey, false})
		for _, s := range e.Build.Secrets {
			needs = append(needs, need{"build.secrets", s.Name, "", true})
		}
	} else {
		needs = append(needs, need{"sign.keySecret", e.Sign.KeySecret.Name, "key", true},
			need{"sign.certSecret", e.Sign.CertSecret.Name, "cert", true})
	}
	for _, n := range needs {
		if msg := r.lacks(ctx, m.Namespace, n.what, n.name, n.key, n.secret); msg != "" {
			return msg
		}
	}
	// The pod mounts the ServiceAccount's pull secrets, as worker pods do: one that cannot be read
	// (an install without get on serviceaccounts) fails the run with the reason, not the pod.
	if _, err := shared.ServiceAccountPullSecrets(ctx, r.reader(), m.Namespace, serviceAccount(m)); err != nil {
		return err.Error()
	}
	return ""
}

// lacks says what is wrong with a ConfigMap or Secret a pod needs ("" when it is there with key).
func (r *Reconciler) lacks(ctx context.Context, ns, what, name, key string, secret bool) string {
	kind := "ConfigMap"
	var obj client.Object = &corev1.ConfigMap{}
	if secret {
		kind, obj = "Secret", &corev1.Secret{}
	}
	err := r.reader().Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("the %s %s/%s (%s) does not exist", kind, ns, name, what)
	case err != nil:
		return fmt.Sprintf("reading the %s %s/%s (%s): %v", kind, ns, name, what, err)
	case key == "":
		return ""
	}
	has := false
	switch o := obj.(type) {
	case *corev1.Secret:
		_, has = o.Data[key]
	case *corev1.ConfigMap:
		_, has = o.Data[key]
	}
	if !has {
		return fmt.Sprintf("the %s %s/%s (%s) has no key %q", kind, ns, name, what, key)
	}
	return ""
}
