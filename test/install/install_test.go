package install_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/internal/logging"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/netport"
	"github.com/kmm-project/kmm/test/poll"
)

const (
	ns              = "kmm-system"
	deploymentName  = "kmm-controller-manager"
	secretName      = "kmm-webhook-cert"
	webhookName     = "kmm-validating-webhook"
	serviceName     = "kmm-webhook-service"
	serviceDNS      = serviceName + "." + ns + ".svc"
	endpointSlice   = serviceName + "-test"
	testNamespace   = "install-test"
	invalidRegexp   = "("
	rejectedField   = "spec.moduleLoader.container.kernelMappings[0].regexp"
	webhookRejected = `admission webhook "vmodule.kmm.sigs.x-k8s.io" denied the request`
)

// TestInstall installs config/default as an administrator would and runs the operator from the
// rendered Deployment's arguments, as its ServiceAccount, with no certificate at the start: it must
// create the Secret, inject the caBundle and become ready, after which the API server rejects an
// invalid Module through the webhook and admits a valid one. A second replica shares the
// certificate without a write, and a rotation with two replicas fails no admission.
func TestInstall(t *testing.T) {
	ctx := context.Background()
	root, kustomize := tools(t)
	objs, err := install.Render(ctx, kustomize, filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, env.Config)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	setLogger(t)
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	step("applies with a server-side dry run, then for real", func(t *testing.T) {
		// A dry run cannot create objects in a namespace that does not exist yet.
		if err := install.Apply(ctx, admin, []*unstructured.Unstructured{install.Find(objs, "Namespace", ns)}, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := install.Apply(ctx, admin, objs, true, nil); err != nil {
			t.Fatalf("server-side dry run: %v", err)
		}
		if err := install.Apply(ctx, admin, objs, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: secretName}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the install holds the certificate Secret (get: %v); the operator must create it", err)
		}
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}); err != nil {
			t.Fatal(err)
		}
	})

	operator := serviceAccountConfig(t, cs, ns, "kmm-controller-manager")
	rendered, err := install.ContainerArgs(install.Find(objs, "Deployment", deploymentName), "manager")
	if err != nil {
		t.Fatal(err)
	}
	port := webhookContainerPort(t, objs)
	var a, b *replica
	var all []*replica
	t.Cleanup(func() {
		for _, r := range all {
			r.stop()
		}
	})
	start := func(t *testing.T, podIP string, extra ...string) *replica {
		r := startReplica(t, operator, rendered, podIP, port, extra...)
		all = append(all, r)
		return r
	}

	step("the first replica creates the Secret, injects the caBundle and becomes ready", func(t *testing.T) {
		a = start(t, "192.0.2.1")
		took := a.waitReady(t)
		t.Logf("first replica: start to ready (Secret created and filled, caBundle injected, webhook serving) in %v", took.Round(time.Millisecond))
		secret := getSecret(t, admin)
		for _, k := range []string{"ca.crt", "ca.key", "tls.crt", "tls.key"} {
			if len(secret.Data[k]) == 0 {
				t.Errorf("the Secret has no %s", k)
			}
		}
		if got := caBundle(t, admin); !bytes.Equal(got, secret.Data["ca.crt"]) {
			t.Fatalf("the caBundle of %s is not the Secret's CA:\n%s", webhookName, got)
		}
		if fp := a.servedCert(t, secret.Data["ca.crt"]); fp != fingerprint(secret.Data["tls.crt"]) {
			t.Fatal("the webhook serves another certificate than the Secret's")
		}
		publish(t, admin, port, a)
	})

	step("an invalid Module is rejected through the API server naming the field, a valid one admitted", func(t *testing.T) {
		err := admin.Create(ctx, module("bad-regexp", invalidRegexp))
		assertRejected(t, err)
		good := module("good", "^6\\.1\\..*$")
		if err := admin.Create(ctx, good); err != nil {
			t.Fatalf("a valid Module was refused: %v", err)
		}
		// The leader's Module controller runs (as the operator's ServiceAccount) and its finalizer
		// write goes through the webhook too.
		poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			m := &kmmv1beta1.Module{}
			err := admin.Get(ctx, client.ObjectKeyFromObject(good), m)
			return err == nil && slices.Contains(m.Finalizers, "kmm.sigs.x-k8s.io/unload"), "the operator's finalizer on the valid Module"
		})
		// The namespace guard, through config/default's webhook configuration (its objectSelector on
		// the label the operator sets): the Module's namespace cannot be deleted while it holds it.
		poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			ns := &corev1.Namespace{}
			err := admin.Get(ctx, client.ObjectKey{Name: testNamespace}, ns)
			_, labelled := ns.Labels[kmmv1beta1.NamespaceLabel]
			return err == nil && labelled, "the Module's namespace labelled " + kmmv1beta1.NamespaceLabel
		})
		if err := admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}); !apierrors.IsForbidden(err) {
			t.Fatalf("deleting the namespace of a Module: %v, want it refused", err)
		}
		if err := admin.Delete(ctx, good); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			err := admin.Get(ctx, client.ObjectKeyFromObject(good), &kmmv1beta1.Module{})
			return apierrors.IsNotFound(err), "the valid Module to be gone after its deletion"
		})
		if proxy.Conns(a.podAddr) == 0 {
			t.Fatalf("the API server never connected to %s through the Service", a.podAddr)
		}
	})

	var metricsTLSConfig *tls.Config
	step("metrics serve the operator's certificate, verified as config/prometheus's ServiceMonitor verifies it", func(t *testing.T) {
		metricsTLSConfig = metricsTLS(t, admin)
		conn, err := tls.Dial("tcp", a.metricsAddr, metricsTLSConfig)
		if err != nil {
			t.Fatalf("a TLS handshake with the metrics endpoint, trusting the ServiceMonitor's CA for %s: %v", metricsTLSConfig.ServerName, err)
		}
		defer func() { _ = conn.Close() }()
		if got, want := fmt.Sprintf("%x", sha256.Sum256(conn.ConnectionState().PeerCertificates[0].Raw)), fingerprint(getSecret(t, admin).Data["tls.crt"]); got != want {
			t.Error("the metrics endpoint serves another certificate than the Secret's")
		}
	})

	step("metrics answer only a token allowed to get /metrics", func(t *testing.T) {
		if code := a.metrics(t, metricsTLSConfig, ""); code != http.StatusUnauthorized {
			t.Errorf("no token: %d, want 401", code)
		}
		reader := scraper(t, admin, cs, "metrics-reader", true)
		stranger := scraper(t, admin, cs, "metrics-stranger", false)
		if code := a.metrics(t, metricsTLSConfig, stranger); code != http.StatusForbidden {
			t.Errorf("a token not bound to kmm-metrics-reader: %d, want 403", code)
		}
		if code := a.metrics(t, metricsTLSConfig, reader); code != http.StatusOK {
			t.Errorf("a token bound to kmm-metrics-reader: %d, want 200", code)
		}
	})

	step("a second replica serves the same certificate without writing it", func(t *testing.T) {
		w := watchWrites(t, cs)
		b = start(t, "192.0.2.2")
		t.Logf("second replica: start to ready in %v", b.waitReady(t).Round(time.Millisecond))
		publish(t, admin, port, a, b)
		failures := admitLoop(t, admin, 5*time.Second, a, b)
		secret := getSecret(t, admin)
		for _, r := range []*replica{a, b} {
			if fp := r.servedCert(t, secret.Data["ca.crt"]); fp != fingerprint(secret.Data["tls.crt"]) {
				t.Errorf("%s serves another certificate than the Secret's", r.podAddr)
			}
			if proxy.Conns(r.podAddr) == 0 {
				t.Errorf("the API server never called %s", r.podAddr)
			}
		}
		secrets, webhooks := w.stop()
		if len(secrets) != 0 || webhooks != 0 {
			t.Errorf("with a second replica the Secret was written %d times and the webhook configuration %d times, want 0 and 0", len(secrets), webhooks)
		}
		if len(failures) > 0 {
			t.Errorf("%d admissions or connections failed with two replicas, first: %v", len(failures), failures[0])
		}
	})

	step("rotation with two replicas fails no admission and writes each certificate once", func(t *testing.T) {
		a.stop()
		b.stop()
		publish(t, admin, port)
		// Start again from no certificate, with a short one: 20 s, replaced 14 s before its end
		// (so every ~6 s), checked every second.
		if err := admin.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName}}); err != nil {
			t.Fatal(err)
		}
		short := []string{"--cert-validity=20s", "--cert-refresh-before=14s", "--cert-check-interval=1s"}
		a = start(t, "192.0.2.1", short...)
		b = start(t, "192.0.2.2", short...)
		a.waitReady(t)
		b.waitReady(t)
		publish(t, admin, port, a, b)
		first := getSecret(t, admin)

		w := watchWrites(t, cs)
		start := time.Now()
		failures := admitLoop(t, admin, 32*time.Second, a, b)
		secrets, webhooks := w.stop()
		for i, f := range failures {
			if i == 5 {
				t.Errorf("... %d failures in all", len(failures))
				break
			}
			t.Errorf("during the rotations: %v", f)
		}
		if webhooks != 0 {
			t.Errorf("the webhook configuration was written %d times during the rotations, want 0 (the CA stays)", webhooks)
		}
		if len(secrets) < 3 {
			t.Fatalf("%d certificate writes in %v, want at least 3 rotations", len(secrets), time.Since(start).Round(time.Second))
		}
		prev, prevAt := fingerprint(first.Data["tls.crt"]), start
		for i, s := range secrets {
			if s.ca != fingerprint(first.Data["ca.crt"]) {
				t.Errorf("write %d replaced the CA", i)
			}
			if s.cert == prev {
				t.Errorf("write %d wrote the certificate that was there", i)
			}
			if i > 0 && s.at.Sub(prevAt) < 3*time.Second {
				t.Errorf("write %d came %v after the one before: the replicas fight over the Secret", i, s.at.Sub(prevAt))
			}
			prev, prevAt = s.cert, s.at
		}
		t.Logf("%d rotations in %v with two replicas, intervals: %v; %d admissions and a new connection to each replica every 100 ms, %d failed", len(secrets),
			time.Since(start).Round(time.Second), intervals(start, secrets), admissions, len(failures))
		// Both replicas end up serving the last certificate.
		current := getSecret(t, admin)
		poll.Until(t, 5*time.Second, 100*time.Millisecond, func() (bool, string) {
			return a.servedCert(t, current.Data["ca.crt"]) == fingerprint(current.Data["tls.crt"]) &&
				b.servedCert(t, current.Data["ca.crt"]) == fingerprint(current.Data["tls.crt"]), "both replicas to serve the Secret's certificate"
		})
	})

	var pull *pullScenario
	whole := t
	step("cluster-wide Secret get: a PreflightValidation reads the Modules' pull secrets; no list or watch of Secrets outside kmm-system", func(t *testing.T) {
		pull = setupPullScenario(t, whole, admin)
		pull.verify(t, admin, "secrets-cluster-wide", map[string]string{
			secretsNSA: kmmv1beta1.PreflightReasonSuccess, secretsNSB: kmmv1beta1.PreflightReasonSuccess,
		}, 60*time.Second)
		if allowed := secretVerbsOutsideOwnNamespace(t, operator); len(allowed) > 0 {
			t.Errorf("the operator may %s", strings.Join(allowed, ", "))
		}
		if !operatorMayGetSecrets(t, admin, metav1.NamespaceAll) {
			t.Error("config/default: the operator may not get Secrets in every namespace")
		}
	})

	step("namespaced Secret access (config/components/namespaced-secrets): a pull secret is read only where a RoleBinding grants it, SecretForbidden elsewhere", func(t *testing.T) {
		a.stop()
		b.stop()
		publish(t, admin, port)
		scoped := renderWithComponents(t, "default", namespacedSecrets)
		// What the component leaves out goes, as `kubectl apply --prune` would remove it.
		for _, u := range objs {
			if install.Find(scoped, u.GetKind(), u.GetName()) == nil {
				if err := admin.Delete(ctx, u.DeepCopy()); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := install.Apply(ctx, admin, scoped, false, nil); err != nil {
			t.Fatal(err)
		}
		args, err := install.ContainerArgs(install.Find(scoped, "Deployment", deploymentName), "manager")
		if err != nil {
			t.Fatal(err)
		}
		a = startReplica(t, operator, args, "192.0.2.1", port)
		all = append(all, a)
		a.waitReady(t)
		publish(t, admin, port, a)

		sampleRoleBindingIn(t, admin, secretsNSA)
		inA, inB, everywhere := operatorMayGetSecrets(t, admin, secretsNSA), operatorMayGetSecrets(t, admin, secretsNSB), operatorMayGetSecrets(t, admin, metav1.NamespaceAll)
		if !inA || inB || everywhere {
			t.Errorf("the operator may get Secrets in %s: %v, in %s: %v, everywhere: %v; want only in %s", secretsNSA, inA, secretsNSB, inB, everywhere, secretsNSA)
		}
		if allowed := secretVerbsOutsideOwnNamespace(t, operator); len(allowed) > 0 {
			t.Errorf("the operator may %s", strings.Join(allowed, ", "))
		}
		got := pull.verify(t, admin, "secrets-namespaced", map[string]string{
			secretsNSA: kmmv1beta1.PreflightReasonSuccess, secretsNSB: kmmv1beta1.PreflightReasonSecretForbidden,
		}, 60*time.Second)
		refused := got[secretsNSB]
		if refused.VerificationStage != kmmv1beta1.VerificationStageImage || !strings.Contains(refused.StatusReason, "RoleBinding") || !strings.Contains(refused.StatusReason, secretsNSB) {
			t.Errorf("the refused read: stage %s, %q; want it retried and naming the RoleBinding to create in %s", refused.VerificationStage, refused.StatusReason, secretsNSB)
		}
		poll.Until(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
			return forbiddenEvent(t, admin, "secrets-namespaced", secretsNSB), "a Warning Event PreflightSecretForbidden for " + secretsNSB
		})
		// The administrator grants it: the next check (back-off) reads the Secret.
		sampleRoleBindingIn(t, admin, secretsNSB)
		pull.wait(t, admin, "secrets-namespaced", map[string]string{secretsNSB: kmmv1beta1.PreflightReasonSuccess}, 90*time.Second)
		pull.cleanup(t, admin)
	})

	step("uninstall refuses while Modules exist, then removes kmm with the CRDs last", func(t *testing.T) {
		left := module("left", "^6\\.1\\..*$")
		if err := admin.Create(ctx, left); err != nil {
			t.Fatal(err)
		}
		if err := install.Delete(ctx, admin, objs, false, nil); !errors.Is(err, install.ErrModulesLeft) {
			t.Fatalf("uninstall with a Module left: %v, want %v", err, install.ErrModulesLeft)
		}
		if err := admin.Get(ctx, client.ObjectKey{Name: webhookName}, &admissionregistrationv1.ValidatingWebhookConfiguration{}); err != nil {
			t.Fatalf("the refused uninstall deleted something: %v", err)
		}
		// The operator unloads (here: nothing, no node is selected) and lets the Module go.
		if err := admin.Delete(ctx, left); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKeyFromObject(left), &kmmv1beta1.Module{})), "the Module to be gone"
		})
		if err := install.Delete(ctx, admin, objs, false, nil); err != nil {
			t.Fatal(err)
		}
		a.stop()
		b.stop()
		// kube-apiserver's CRD finalizer gives a CRD's instances up to a minute to go before it
		// retries (apiextensions-apiserver's crd_finalizer.go); the wait is that bound and some.
		// A CRD still there is reported with its finalizers and Terminating condition.
		poll.Until(t, 90*time.Second, 100*time.Millisecond, func() (bool, string) {
			for _, u := range objs {
				if u.GetKind() != "CustomResourceDefinition" && u.GetKind() != "ValidatingWebhookConfiguration" && u.GetKind() != "Deployment" {
					continue
				}
				got := &unstructured.Unstructured{}
				got.SetGroupVersionKind(u.GroupVersionKind())
				if err := admin.Get(ctx, client.ObjectKeyFromObject(u), got); !apierrors.IsNotFound(err) {
					conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
					return false, fmt.Sprintf("%s %s to be gone (%v; finalizers %v, deleting since %v, conditions %v)", u.GetKind(), u.GetName(), err,
						got.GetFinalizers(), got.GetDeletionTimestamp(), conds)
				}
			}
			return true, ""
		})
	})
}

// tools returns the repository root and bin/kustomize.
func tools(t *testing.T) (root, kustomize string) {
	t.Helper()
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kustomize, err = install.Kustomize(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, kustomize
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: install.Scheme(app.NewScheme())})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// setLogger sends the operator's logs to a file, shown when the test fails.
func setLogger(t *testing.T) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "operator.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	log, err := logging.New(f, "info", false)
	if err != nil {
		t.Fatal(err)
	}
	ctrl.SetLogger(log)
	t.Cleanup(func() {
		if t.Failed() {
			data, _ := os.ReadFile(path)
			lines := strings.Split(string(data), "\n")
			t.Logf("last operator log lines:\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
		_ = f.Close()
	})
}

// serviceAccountConfig returns a client configuration that authenticates as the ServiceAccount,
// with a token from the TokenRequest API (what the kubelet mounts into the pod).
func serviceAccountConfig(t *testing.T, cs kubernetes.Interface, namespace, name string) *rest.Config {
	t.Helper()
	return &rest.Config{
		Host:            env.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData},
		BearerToken:     token(t, cs, namespace, name),
	}
}

func token(t *testing.T, cs kubernetes.Interface, namespace, name string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// webhookContainerPort resolves the webhook Service's targetPort against the Deployment's
// container ports, as the EndpointSlice controller does.
func webhookContainerPort(t *testing.T, objs []*unstructured.Unstructured) int32 {
	t.Helper()
	svc := install.Find(objs, "Service", serviceName)
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 1 {
		t.Fatalf("the webhook Service has %d ports, want 1", len(ports))
	}
	target := fmt.Sprint(ports[0].(map[string]any)["targetPort"])
	containers, _, _ := unstructured.NestedSlice(install.Find(objs, "Deployment", deploymentName).Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		cp, _, _ := unstructured.NestedSlice(c.(map[string]any), "ports")
		for _, p := range cp {
			pm := p.(map[string]any)
			if pm["name"] == target || fmt.Sprint(pm["containerPort"]) == target {
				n, _, _ := unstructured.NestedInt64(pm, "containerPort")
				return int32(n)
			}
		}
	}
	t.Fatalf("the webhook Service's targetPort %q is no port of the Deployment", target)
	return 0
}

// replica is one operator process of the Deployment, run in this test process: its pod IP is a
// TEST-NET-1 address, its ports loopback ports, its emptyDir a temporary directory. It runs until
// stop, past the subtest that started it.
type replica struct {
	podAddr                         string
	webhookAddr, probe, metricsAddr string
	started                         time.Time
	cancel                          context.CancelFunc
	done                            chan error
	once                            sync.Once
}

func startReplica(t *testing.T, cfg *rest.Config, rendered []string, podIP string, port int32, extra ...string) *replica {
	t.Helper()
	r := &replica{podAddr: net.JoinHostPort(podIP, fmt.Sprint(port)), webhookAddr: freeAddr(t), probe: freeAddr(t), metricsAddr: freeAddr(t), done: make(chan error, 1)}
	host, wport, _ := net.SplitHostPort(r.webhookAddr)
	dir, err := os.MkdirTemp("", "kmm-serving-certs-")
	if err != nil {
		t.Fatal(err)
	}
	// What differs from the pod: where it listens and its emptyDir. Later flags win.
	args := append(slices.Clone(rendered), "--webhook-host="+host, "--webhook-port="+wport, "--webhook-cert-dir="+dir,
		"--health-probe-bind-address="+r.probe, "--metrics-bind-address="+r.metricsAddr)
	a, err := app.ParseArgs(append(args, extra...))
	if err != nil {
		t.Fatalf("the rendered Deployment's arguments do not parse: %v", err)
	}
	a.AllowRestartInProcess = true // two replicas in one process
	r.started = time.Now()
	mgr, err := app.New(cfg, a.Options)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		r.done <- mgr.Start(ctx)
		_ = os.RemoveAll(dir)
	}()
	proxy.Route(r.podAddr, r.webhookAddr)
	return r
}

func (r *replica) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			_ = err // a replica that fails shows in its test's checks and log
		case <-time.After(30 * time.Second):
		}
	})
}

// waitReady waits until /readyz answers 200 and returns how long it took from the start.
func (r *replica) waitReady(t *testing.T) time.Duration {
	t.Helper()
	poll.Until(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		select {
		case err := <-r.done:
			t.Fatalf("the replica stopped: %v", err)
		default:
		}
		resp, err := http.Get("http://" + r.probe + "/readyz")
		if err != nil {
			return false, "the replica's /readyz: " + err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("the replica's /readyz to answer 200 (%d)", resp.StatusCode)
	})
	return time.Since(r.started)
}

// servedCert returns the fingerprint of the certificate the replica serves, after checking it as
// the API server does: signed by ca, for the Service's DNS name.
func (r *replica) servedCert(t *testing.T, ca []byte) string {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	conn, err := tls.Dial("tcp", r.webhookAddr, &tls.Config{RootCAs: pool, ServerName: serviceDNS, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("%s: %v", r.podAddr, err)
	}
	defer func() { _ = conn.Close() }()
	return fmt.Sprintf("%x", sha256.Sum256(conn.ConnectionState().PeerCertificates[0].Raw))
}

// metrics GETs /metrics over HTTPS, verifying the server with tlsConfig, with the bearer token
// (none when empty) and returns the status.
func (r *replica) metrics(t *testing.T, tlsConfig *tls.Config, bearer string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "https://"+r.metricsAddr+"/metrics", nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && !strings.Contains(string(body), "controller_runtime_") {
		t.Errorf("/metrics answered 200 without controller-runtime's metrics")
	}
	return resp.StatusCode
}

// scraper creates a ServiceAccount, bound to kmm-metrics-reader when bound, and returns its token.
func scraper(t *testing.T, c client.Client, cs kubernetes.Interface, name string, bound bool) string {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name}}); err != nil {
		t.Fatal(err)
	}
	if bound {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kmm-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: testNamespace, Name: name}},
		}
		if err := c.Create(ctx, crb); err != nil {
			t.Fatal(err)
		}
	}
	return token(t, cs, testNamespace, name)
}

// publish sets the webhook Service's endpoints to the replicas, all ready: what the EndpointSlice
// controller does once their readiness probes pass.
func publish(t *testing.T, c client.Client, port int32, replicas ...*replica) {
	t.Helper()
	publishIn(t, c, ns, port, replicas...)
}

// publishIn is publish for the webhook Service of an install in namespace.
func publishIn(t *testing.T, c client.Client, namespace string, port int32, replicas ...*replica) {
	t.Helper()
	ctx := context.Background()
	eps := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: namespace, Name: endpointSlice, Labels: map[string]string{discoveryv1.LabelServiceName: serviceName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(port), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, r := range replicas {
		ip, _, _ := net.SplitHostPort(r.podAddr)
		eps.Endpoints = append(eps.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	old := &discoveryv1.EndpointSlice{}
	err := c.Get(ctx, client.ObjectKeyFromObject(eps), old)
	switch {
	case apierrors.IsNotFound(err):
		err = c.Create(ctx, eps)
	case err == nil:
		eps.ResourceVersion = old.ResourceVersion
		err = c.Update(ctx, eps)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func getSecret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: secretName}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func caBundle(t *testing.T, c client.Client) []byte {
	t.Helper()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: webhookName}, vwc); err != nil {
		t.Fatal(err)
	}
	// Three webhooks (Module, the namespace guard, PreflightValidation), one caBundle injected into
	// all; the namespace guard sees only the namespaces labelled as holding Modules.
	if len(vwc.Webhooks) != 3 {
		t.Fatalf("%s has %d webhooks, want 3", webhookName, len(vwc.Webhooks))
	}
	for _, w := range vwc.Webhooks {
		if sel := w.ObjectSelector; w.Name == "vnamespace.kmm.sigs.x-k8s.io" && (sel == nil || len(sel.MatchExpressions) != 1 ||
			sel.MatchExpressions[0].Key != kmmv1beta1.NamespaceLabel || sel.MatchExpressions[0].Operator != metav1.LabelSelectorOpExists) {
			t.Fatalf("the namespace guard's objectSelector is %v, want %s Exists", sel, kmmv1beta1.NamespaceLabel)
		}
	}
	for _, w := range vwc.Webhooks[1:] {
		if !bytes.Equal(w.ClientConfig.CABundle, vwc.Webhooks[0].ClientConfig.CABundle) {
			t.Fatalf("the webhooks of %s carry different caBundles", webhookName)
		}
	}
	return vwc.Webhooks[0].ClientConfig.CABundle
}

// fingerprint is the SHA-256 of a PEM certificate's DER bytes ("" when there is none).
func fingerprint(pemCert []byte) string {
	block, _ := pem.Decode(pemCert)
	if block == nil {
		return ""
	}
	sum := sha256.Sum256(block.Bytes)
	return hex.EncodeToString(sum[:])
}

func module(name, regexp string) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"kmm-install-test": "yes"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmod"},
				KernelMappings: []kmmv1beta1.KernelMapping{{Regexp: regexp, ContainerImage: "reg.example.com/kmod:$KERNEL_XYZ"}},
			}},
		},
	}
}

func assertRejected(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("a Module with regexp %q was admitted", invalidRegexp)
	}
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), webhookRejected) || !strings.Contains(err.Error(), rejectedField) {
		t.Fatalf("rejected with\n  %v\nwant the webhook's Invalid error naming %s", err, rejectedField)
	}
}

// admissions counts the admission reviews admitLoop asked for.
var admissions int

// admitLoop sends dry-run creates through the API server for d, every 100 ms: a valid Module that
// must be admitted, and every third time an invalid one that the webhook must reject naming the
// field. The API server keeps its connections to a webhook open, so a certificate is checked only
// when one is opened; each round therefore also opens one to every replica as the API server would
// (verified against the caBundle in the webhook configuration at that moment). It returns what
// went otherwise.
func admitLoop(t *testing.T, c client.Client, d time.Duration, replicas ...*replica) []error {
	t.Helper()
	ctx := context.Background()
	var failures []error
	for i := 0; time.Duration(i)*100*time.Millisecond < d; i++ {
		at := time.Now()
		if err := c.Create(ctx, module(fmt.Sprintf("loop-%d", i), "^6\\.1\\..*$"), client.DryRunAll); err != nil {
			failures = append(failures, fmt.Errorf("at %s: a valid Module: %w", at.Format("15:04:05.000"), err))
		}
		admissions++
		if i%3 == 0 {
			err := c.Create(ctx, module(fmt.Sprintf("loop-bad-%d", i), invalidRegexp), client.DryRunAll)
			if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), rejectedField) {
				failures = append(failures, fmt.Errorf("at %s: an invalid Module: %v", at.Format("15:04:05.000"), err))
			}
			admissions++
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caBundle(t, c))
		for _, r := range replicas {
			conn, err := tls.Dial("tcp", r.webhookAddr, &tls.Config{RootCAs: pool, ServerName: serviceDNS, MinVersion: tls.VersionTLS12})
			if err != nil {
				failures = append(failures, fmt.Errorf("at %s: a new connection to %s: %w", at.Format("15:04:05.000"), r.podAddr, err))
				continue
			}
			_ = conn.Close()
		}
		time.Sleep(time.Until(at.Add(100 * time.Millisecond)))
	}
	return failures
}

// secretWrite is one write of the certificate Secret: when, and the fingerprints it carried.
type secretWrite struct {
	at       time.Time
	cert, ca string
}

// writes records the writes of the certificate Secret and of the webhook configuration.
type writes struct {
	mu       sync.Mutex
	secrets  []secretWrite
	webhooks int
	stops    []func()
	wg       sync.WaitGroup
}

func watchWrites(t *testing.T, cs kubernetes.Interface) *writes {
	t.Helper()
	ctx := context.Background()
	w := &writes{}
	secrets, err := cs.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", secretName).String(), ResourceVersion: getSecretRV(t, cs)})
	if err != nil {
		t.Fatal(err)
	}
	hooks, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", webhookName).String(), ResourceVersion: getWebhookRV(t, cs)})
	if err != nil {
		t.Fatal(err)
	}
	w.stops = []func(){secrets.Stop, hooks.Stop}
	w.wg.Add(2)
	go func() {
		defer w.wg.Done()
		for ev := range secrets.ResultChan() {
			if s, ok := ev.Object.(*corev1.Secret); ok && ev.Type == watch.Modified {
				w.mu.Lock()
				w.secrets = append(w.secrets, secretWrite{at: time.Now(), cert: fingerprint(s.Data["tls.crt"]), ca: fingerprint(s.Data["ca.crt"])})
				w.mu.Unlock()
			}
		}
	}()
	go func() {
		defer w.wg.Done()
		for ev := range hooks.ResultChan() {
			if ev.Type == watch.Modified {
				w.mu.Lock()
				w.webhooks++
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *writes) stop() ([]secretWrite, int) {
	for _, s := range w.stops {
		s()
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.secrets), w.webhooks
}

func getSecretRV(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	s, err := cs.CoreV1().Secrets(ns).Get(context.Background(), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.ResourceVersion
}

func getWebhookRV(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), webhookName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return v.ResourceVersion
}

func intervals(start time.Time, ws []secretWrite) []time.Duration {
	out := make([]time.Duration, 0, len(ws))
	prev := start
	for _, w := range ws {
		out = append(out, w.at.Sub(prev).Round(100*time.Millisecond))
		prev = w.at
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := netport.Free("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
