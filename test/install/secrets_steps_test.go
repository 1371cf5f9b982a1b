package install_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/ocireg"
	"github.com/kmm-project/kmm/test/poll"
)

// The pull secret scenario of TestInstall: two namespaces, each with a Module whose image is on a
// registry behind basic authentication and an imageRepoSecret holding the right password, so that
// a PreflightValidation's Success proves the operator read the Secret.
const (
	secretsNSA     = "install-secrets-a"
	secretsNSB     = "install-secrets-b"
	pullSecretName = "pull"
	pfvKernel      = "6.1.0-60-cloud-amd64"
)

type pullScenario struct {
	reg *ocireg.Registry
}

// setupPullScenario starts the registry (until owner ends) and creates the namespaces, Secrets
// and Modules.
func setupPullScenario(t, owner *testing.T, c client.Client) *pullScenario {
	t.Helper()
	reg := ocireg.Start(owner, ocireg.Options{User: "kmm", Password: "s3cret"})
	reg.Push(t, "kmod/private:"+pfvKernel)
	ctx := context.Background()
	for _, n := range []string{secretsNSA, secretsNSB} {
		objs := []client.Object{
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}},
			&corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: pullSecretName},
				Type:       corev1.SecretTypeDockerConfigJson,
				Data:       map[string][]byte{corev1.DockerConfigJsonKey: reg.DockerConfigJSON("kmm", "s3cret")},
			},
			&kmmv1beta1.Module{
				ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "private"},
				Spec: kmmv1beta1.ModuleSpec{
					Selector:        map[string]string{"kmm-install-test": "yes"},
					ImageRepoSecret: &corev1.LocalObjectReference{Name: pullSecretName},
					ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
						Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmod"},
						RegistryTLS:    kmmv1beta1.TLSOptions{Insecure: true},
						KernelMappings: []kmmv1beta1.KernelMapping{{Regexp: `^6\.1\.0-`, ContainerImage: reg.Host + "/kmod/private:$KERNEL_FULL_VERSION"}},
					}},
				},
			},
		}
		for _, o := range objs {
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("creating %T %s/%s: %v", o, o.GetNamespace(), o.GetName(), err)
			}
		}
	}
	return &pullScenario{reg: reg}
}

// verify creates the PreflightValidation name and waits until each namespace's Module has the
// reason in want (namespace -> reason); it returns the entries.
func (s *pullScenario) verify(t *testing.T, c client.Client, name string, want map[string]string, within time.Duration) map[string]kmmv1beta1.PreflightValidationModuleStatus {
	t.Helper()
	ctx := context.Background()
	pv := &kmmv1beta1.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: kmmv1beta1.PreflightValidationSpec{KernelVersion: pfvKernel}}
	if err := c.Create(ctx, pv); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return s.wait(t, c, name, want, within)
}

func (s *pullScenario) wait(t *testing.T, c client.Client, name string, want map[string]string, within time.Duration) map[string]kmmv1beta1.PreflightValidationModuleStatus {
	t.Helper()
	got := map[string]kmmv1beta1.PreflightValidationModuleStatus{}
	poll.Until(t, within, 200*time.Millisecond, func() (bool, string) {
		pv := &kmmv1beta1.PreflightValidation{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, pv); err != nil {
			return false, err.Error()
		}
		clear(got)
		for _, e := range pv.Status.Modules {
			got[e.Namespace] = e
		}
		for n, reason := range want {
			if got[n].Reason != reason {
				return false, fmt.Sprintf("PreflightValidation %s: the Module in %s to be %s (is %q: %s)", name, n, reason, got[n].Reason, got[n].StatusReason)
			}
		}
		return true, ""
	})
	return got
}

// cleanup deletes the Modules and waits until the operator has let them go.
func (s *pullScenario) cleanup(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	for _, n := range []string{secretsNSA, secretsNSB} {
		m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "private"}}
		if err := c.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(m), m)), "the Module in " + n + " to be gone"
		})
	}
}

// secretVerbsOutsideOwnNamespace tries, as the operator's ServiceAccount, to list and watch
// Secrets in other namespaces and in all of them, and returns what was not refused; it also
// checks that listing in kmm-system works (so that a refusal means RBAC, not a broken client).
func secretVerbsOutsideOwnNamespace(t *testing.T, operator *rest.Config) []string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(operator)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the operator cannot list Secrets in %s: %v", ns, err)
	}
	var allowed []string
	for _, n := range []string{secretsNSA, secretsNSB, testNamespace, "default", metav1.NamespaceAll} {
		if _, err := cs.CoreV1().Secrets(n).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			allowed = append(allowed, fmt.Sprintf("list in %q (%v)", n, err))
		}
		w, err := cs.CoreV1().Secrets(n).Watch(ctx, metav1.ListOptions{})
		if err == nil {
			w.Stop()
		}
		if !apierrors.IsForbidden(err) {
			allowed = append(allowed, fmt.Sprintf("watch in %q (%v)", n, err))
		}
	}
	return allowed
}

// operatorMayGetSecrets asks the API server (SubjectAccessReview) whether the operator's
// ServiceAccount may get Secrets in namespace ("" for every namespace).
func operatorMayGetSecrets(t *testing.T, c client.Client, namespace string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + ns + ":" + operatorSA,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: "get", Resource: "secrets"},
	}}
	if err := c.Create(context.Background(), sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// sampleRoleBindingIn creates the sample RoleBinding (config/samples) in namespace.
func sampleRoleBindingIn(t *testing.T, c client.Client, namespace string) {
	t.Helper()
	root, _ := tools(t)
	data, err := os.ReadFile(filepath.Join(root, sampleRoleBinding))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Decode(data)
	if err != nil || len(objs) != 1 {
		t.Fatalf("%s: %d objects (%v), want 1", sampleRoleBinding, len(objs), err)
	}
	rb := &rbacv1.RoleBinding{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, rb); err != nil {
		t.Fatal(err)
	}
	rb.Namespace = namespace
	if err := c.Create(context.Background(), rb); err != nil {
		t.Fatal(err)
	}
	// kube-apiserver's RBAC authorizer reads RoleBindings from its informers: a grant takes effect
	// a moment after its create returns (the clean-clone CI run of 99c7b45 asked at once and was
	// denied). Wait until the operator may read Secrets there, as the operator itself would retry.
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() (bool, string) {
		return operatorMayGetSecrets(t, c, namespace), "the RoleBinding in " + namespace + " to grant the operator get on Secrets"
	})
}

// forbiddenEvent reports whether a Warning Event PreflightSecretForbidden regards the
// PreflightValidation name and names the namespace.
func forbiddenEvent(t *testing.T, c client.Client, name, namespace string) bool {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason == "Preflight"+kmmv1beta1.PreflightReasonSecretForbidden && e.Regarding.Name == name && e.Type == corev1.EventTypeWarning &&
			strings.Contains(e.Note, namespace+"/"+pullSecretName) {
			return true
		}
	}
	return false
}

// metricsTLS is how config/prometheus's ServiceMonitor verifies the metrics endpoint: the CA of the
// Secret it names, for its serverName.
func metricsTLS(t *testing.T, c client.Client) *tls.Config {
	t.Helper()
	monitor := install.Find(render(t, "prometheus"), "ServiceMonitor", monitorName)
	secretName, key, serverName := monitorTLS(t, monitor)
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: monitor.GetNamespace(), Name: secretName}, s); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data[key]) {
		t.Fatalf("Secret %s has no CA certificate under %s", secretName, key)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
}
