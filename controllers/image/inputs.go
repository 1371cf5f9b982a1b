package image

import (
	"context"
	"fmt"

	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/preflight"
)

func (r *Reconciler) reader() client.Reader {
	if r.APIReader == nil {
		return r.Client
	}
	return r.APIReader
}

// check asks the image's registry whether the image exists (one manifest HEAD, bounded by the
// Registry's timeout), with the Module's pull secret. A refused or absent pull secret, a denial
// and no answer are all an error, which the machine retries with back-off.
func (r *Reconciler) check(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec) image.RegistryAnswer {
	var pull []corev1.Secret
	if ps := mic.Spec.ImageRepoSecret; ps != nil {
		s := &corev1.Secret{}
		if err := r.reader().Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ps.Name}, s); err != nil {
			return image.RegistryAnswer{Answer: image.AnswerError, Message: fmt.Sprintf("reading the imageRepoSecret %s: %v", ps.Name, err)}
		}
		pull = append(pull, *s)
	}
	kc, err := kauth.NewFromPullSecrets(ctx, pull)
	if err != nil {
		return image.RegistryAnswer{Answer: image.AnswerError, Message: "the imageRepoSecret is not a pull secret: " + err.Error()}
	}
	t := preflight.Target{Image: e.Image}
	if e.RegistryTLS != nil {
		t.RegistryTLS = *e.RegistryTLS
	}
	res := r.Registry.Check(ctx, t, kc, nil)
	switch res.Outcome {
	case preflight.Found:
		return image.RegistryAnswer{Answer: image.AnswerPresent}
	case preflight.NotFound:
		return image.RegistryAnswer{Answer: image.AnswerMissing, Message: res.Detail}
	}
	return image.RegistryAnswer{Answer: image.AnswerError, Message: fmt.Sprintf("%s: %s", res.Outcome, res.Detail)}
}

// missingInput says why the pod of kind cannot start ("" when it can): its ConfigMap (with the key
// "dockerfile"), a Secret it mounts (with the key it reads), or a recipe the pod cannot be made
// from. Such a pod would wait in ContainerCreating until its deadline; the run fails at once instead.
func (r *Reconciler) missingInput(ctx context.Context, m *kmmv1beta1.Module, mic *kmmv1beta1.ModuleImagesConfig, e *kmmv1beta1.ModuleImageSpec, kind image.PodKind) string {
	var err error
	if kind == image.BuildPod {
		_, err = build.Pod(buildRequest(m, mic, e, 0, r.BuilderImage))
	} else {
		_, err = signPod(m, mic, e, 0, r.WorkerImage)
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
