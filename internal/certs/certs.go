// Package certs gives the admission webhook a serving certificate that kmm provisions and rotates
// itself: github.com/open-policy-agent/cert-controller generates the CA and the serving certificate
// into a Secret, renews them well before they expire and injects the CA into kmm's
// ValidatingWebhookConfiguration; this package creates that Secret when it is missing, copies the
// certificate from it into the webhook server's certificate directory (no kubelet volume, so a new
// certificate is served within a second of being written), and says when the webhook may be called.
//
// Every replica runs it (no leader election): the Secret is written with optimistic concurrency, so
// when two replicas decide to renew at once the second one's write conflicts, it reads the first
// one's certificate, finds it valid and writes nothing.
package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
)

// The Secret and the webhook configuration are kmm's own: the operator may read the Secrets of its
// namespace (the rotator's cache lists them) but update only its certificate Secret, and update only
// its own webhook configuration. The names here are the flags' defaults (config/default).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=list;watch;create,namespace=kmm-system
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;update,resourceNames=kmm-webhook-cert,namespace=kmm-system
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=list;watch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,verbs=get;update,resourceNames=kmm-validating-webhook
// The PreflightValidation CRD's conversion webhook gets the same caBundle (the rotator lists and
// watches CRDs to find it; it writes only that one).
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=list;watch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;update,resourceNames=preflightvalidations.kmm.sigs.x-k8s.io

// Who provides the webhook's serving certificate (the --cert-management flag).
const (
	// ModeSelf: kmm provisions and rotates it (this package).
	ModeSelf = "self"
	// ModeNone: something else puts tls.crt and tls.key into the certificate directory, e.g.
	// cert-manager through a Secret volume (config/cert-manager), and injects the caBundle.
	ModeNone = "none"
)

// Files written into the certificate directory. ca.key stays in the Secret.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// caValidity is how long a generated CA is valid; it is renewed RefreshBefore its end, like the
// serving certificate. Renewing the CA changes the caBundle (see docs/install.md).
const caValidity = 10 * 365 * 24 * time.Hour

// Options say where the certificate lives and how long it lasts.
type Options struct {
	// SecretName and Namespace name the Secret holding the CA and the serving certificate; the
	// Namespace is also the webhook Service's.
	SecretName string
	Namespace  string
	// WebhookConfigName is the ValidatingWebhookConfiguration whose caBundle is kept current.
	WebhookConfigName string
	// ConversionCRD is the CustomResourceDefinition whose conversion webhook (served by the same
	// server, at /convert) gets the same caBundle; "" none.
	ConversionCRD string
	// ServiceName is the webhook Service: the certificate is for <ServiceName>.<Namespace>.svc.
	ServiceName string
	// MetricsServiceName, when set, is the metrics Service: the certificate also covers
	// <MetricsServiceName>.<Namespace>.svc, so that a scraper (the ServiceMonitor of
	// config/prometheus) verifies the metrics endpoint with the same CA.
	MetricsServiceName string
	// CertDir is the webhook server's certificate directory (tls.crt, tls.key; ca.crt too).
	CertDir string
	// Validity is how long a serving certificate is valid; RefreshBefore how long before its end
	// it is replaced; CheckInterval how often that is checked.
	Validity      time.Duration
	RefreshBefore time.Duration
	CheckInterval time.Duration
	// ControllerName names the rotator's controller (unique per process).
	ControllerName string
}

// DefaultOptions are the settings of config/default.
func DefaultOptions() Options {
	return Options{ //nolint:gosec // G101: names of Kubernetes objects, no credentials
		SecretName:         "kmm-webhook-cert",
		Namespace:          "kmm-system",
		WebhookConfigName:  "kmm-validating-webhook",
		ConversionCRD:      "preflightvalidations.kmm.sigs.x-k8s.io",
		ServiceName:        "kmm-webhook-service",
		MetricsServiceName: "kmm-metrics-service",
		Validity:           365 * 24 * time.Hour,
		RefreshBefore:      90 * 24 * time.Hour,
		CheckInterval:      time.Hour,
		ControllerName:     "kmm-cert-rotator",
	}
}

// Validate reports settings that cannot work.
func (o Options) Validate() error {
	if o.SecretName == "" || o.Namespace == "" || o.WebhookConfigName == "" || o.ServiceName == "" || o.CertDir == "" {
		return fmt.Errorf("the certificate Secret, its namespace, the webhook configuration, the webhook Service and the certificate directory must all be set, got %q, %q, %q, %q, %q",
			o.SecretName, o.Namespace, o.WebhookConfigName, o.ServiceName, o.CertDir)
	}
	if o.CheckInterval <= 0 || o.RefreshBefore <= 0 || o.Validity <= o.RefreshBefore+o.CheckInterval {
		return fmt.Errorf("cert-validity (%v) must exceed cert-refresh-before (%v) plus cert-check-interval (%v), all positive",
			o.Validity, o.RefreshBefore, o.CheckInterval)
	}
	return nil
}

// DNSName is the name the API server checks the certificate against: <service>.<namespace>.svc.
func (o Options) DNSName() string { return o.ServiceName + "." + o.Namespace + ".svc" }

// DNSNames are every name the serving certificate covers: the webhook Service's (DNSName first)
// and, with MetricsServiceName, the metrics Service's, each also with .cluster.local.
func (o Options) DNSNames() []string {
	names := []string{o.DNSName(), o.DNSName() + ".cluster.local"}
	if o.MetricsServiceName != "" {
		m := o.MetricsServiceName + "." + o.Namespace + ".svc"
		names = append(names, m, m+".cluster.local")
	}
	return names
}

func (o Options) secretKey() types.NamespacedName {
	return types.NamespacedName{Namespace: o.Namespace, Name: o.SecretName}
}

// SecretCache is the manager cache's setting for Secrets: only the certificate Secret.
func (o Options) SecretCache() cache.ByObject {
	return cache.ByObject{
		Namespaces: map[string]cache.Config{o.Namespace: {}},
		Field:      fields.OneTermEqualSelector("metadata.name", o.SecretName),
	}
}

// EnsureSecret creates the certificate Secret, empty, when it does not exist: the rotator fills
// Secrets, it does not create them. Call it before the manager starts, so that the rotator's cache
// holds the Secret when it first looks.
func EnsureSecret(ctx context.Context, c client.Client, o Options) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: o.SecretName, Namespace: o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "kmm", "app.kubernetes.io/component": "webhook-certificate"},
		},
		Type: corev1.SecretTypeOpaque,
	}
	err := c.Create(ctx, s)
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the certificate Secret %s: %w", o.secretKey(), err)
	}
	return dropIncompleteCert(ctx, c, o)
}

// dropIncompleteCert removes the serving certificate (not the CA) from the Secret when it does not
// cover every name of DNSNames, e.g. one written before the metrics Service's name was added: the
// rotator checks only the webhook's name, and would keep it until its renewal. Without it, the
// rotator issues a new one with the same CA (the caBundle does not change). A conflict means
// another replica wrote the Secret meanwhile; the next start looks again.
func dropIncompleteCert(ctx context.Context, c client.Client, o Options) error {
	s := &corev1.Secret{}
	if err := c.Get(ctx, o.secretKey(), s); err != nil {
		return fmt.Errorf("reading the certificate Secret %s: %w", o.secretKey(), err)
	}
	if len(s.Data[CertFile]) == 0 || CoversAll(s.Data[CertFile], o.DNSNames()) {
		return nil
	}
	delete(s.Data, CertFile)
	delete(s.Data, KeyFile)
	if err := c.Update(ctx, s); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("removing the serving certificate that lacks names from %s: %w", o.secretKey(), err)
	}
	ctrl.Log.WithName("certs").Info("The serving certificate does not cover every name: it will be issued again", "names", o.DNSNames())
	return nil
}

// CoversAll says whether the first certificate of the PEM data is valid for each of names (a
// certificate that does not parse covers nothing).
func CoversAll(certPEM []byte, names []string) bool {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	for _, n := range names {
		if cert.VerifyHostname(n) != nil {
			return false
		}
	}
	return true
}

// Setup adds the rotator and the copy of the certificate into CertDir to mgr, whose cache must
// hold Secrets as SecretCache says (the copy reads the Secret from it). The returned channel is
// closed once the certificate is in CertDir and the caBundle has been injected: only then may the
// webhook server start (it reads the files when it starts) and the API server call it.
func Setup(mgr ctrl.Manager, o Options) (<-chan struct{}, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	r := &rotator.CertRotator{
		SecretKey:          o.secretKey(),
		CertDir:            o.CertDir,
		CAName:             "kmm-webhook-ca",
		CAOrganization:     "kmm",
		DNSName:            o.DNSName(),
		ExtraDNSNames:      o.DNSNames()[1:],
		IsReady:            ready,
		Webhooks:           o.webhooks(),
		FieldOwner:         "kmm-cert-rotator",
		CaCertDuration:     caValidity,
		ServerCertDuration: o.Validity,
		LookaheadInterval:  o.RefreshBefore,
		// Every replica serves the webhook, so every replica keeps its certificate; writes are
		// guarded by the Secret's resourceVersion.
		RequireLeaderElection:  false,
		RotationCheckFrequency: o.CheckInterval,
		CertName:               CertFile,
		KeyName:                KeyFile,
		EnableReadinessCheck:   true,
		ControllerName:         o.ControllerName,
	}
	if err := rotator.AddRotator(mgr, r); err != nil {
		return nil, fmt.Errorf("adding the certificate rotator: %w", err)
	}
	files := &fileSync{Reader: mgr.GetClient(), Key: o.secretKey(), Dir: o.CertDir}
	err := ctrl.NewControllerManagedBy(mgr).
		Named(o.ControllerName+"-files").
		For(&corev1.Secret{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(obj client.Object) bool {
			return obj.GetNamespace() == o.Namespace && obj.GetName() == o.SecretName
		}))).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		Complete(files)
	if err != nil {
		return nil, fmt.Errorf("adding the certificate file sync: %w", err)
	}
	return ready, nil
}

// webhooks are the objects the rotator injects the caBundle into: the webhook configuration and
// the CRD with a conversion webhook. A missing one is skipped (and logged) by the rotator.
func (o Options) webhooks() []rotator.WebhookInfo {
	w := []rotator.WebhookInfo{{Name: o.WebhookConfigName, Type: rotator.Validating}}
	if o.ConversionCRD != "" {
		w = append(w, rotator.WebhookInfo{Name: o.ConversionCRD, Type: rotator.CRDConversion})
	}
	return w
}

// fileSync copies the certificate Secret's tls.crt, tls.key and ca.crt into Dir when they change.
type fileSync struct {
	Reader client.Reader
	Key    types.NamespacedName
	Dir    string
}

// Reconcile writes the files of the Secret's current certificate.
func (f *fileSync) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.NamespacedName != f.Key {
		return ctrl.Result{}, nil
	}
	s := &corev1.Secret{}
	if err := f.Reader.Get(ctx, f.Key, s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if len(s.Data[CertFile]) == 0 || len(s.Data[KeyFile]) == 0 {
		return ctrl.Result{}, nil // not filled yet: the rotator's write will bring us back
	}
	if _, err := tls.X509KeyPair(s.Data[CertFile], s.Data[KeyFile]); err != nil {
		return ctrl.Result{}, fmt.Errorf("the certificate Secret %s holds no usable key pair: %w", f.Key, err)
	}
	changed, err := WriteFiles(f.Dir, map[string][]byte{CAFile: s.Data[CAFile], KeyFile: s.Data[KeyFile], CertFile: s.Data[CertFile]})
	if err != nil {
		return ctrl.Result{}, err
	}
	if changed {
		ctrl.LoggerFrom(ctx).Info("Wrote the webhook serving certificate", "dir", f.Dir)
	}
	return ctrl.Result{}, nil
}

// WriteFiles writes each file whose content differs into dir, each by rename so that a reader sees
// the old or the new content, never a part. The order is ca.crt, tls.key, tls.crt: the webhook
// server's certificate watcher keeps the old pair while the key is new and the certificate not
// yet, and the rotator waits for tls.crt, the last one.
func WriteFiles(dir string, files map[string][]byte) (bool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	changed := false
	for _, name := range []string{CAFile, KeyFile, CertFile} {
		data, ok := files[name]
		if !ok {
			continue
		}
		path := filepath.Join(dir, name)
		if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
			continue
		}
		tmp, err := os.CreateTemp(dir, "."+name+"-")
		if err != nil {
			return changed, err
		}
		_, werr := tmp.Write(data)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr); err != nil {
			_ = os.Remove(tmp.Name())
			return changed, fmt.Errorf("writing %s: %w", path, err)
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			_ = os.Remove(tmp.Name())
			return changed, fmt.Errorf("replacing %s: %w", path, err)
		}
		changed = true
	}
	return changed, nil
}

// ServingChecker is a readiness check: the server at host:port completes a TLS handshake with a
// certificate for dnsName that the CA in certDir/ca.crt signed, as the API server would verify it
// with the caBundle. Until ready is closed it fails without dialling.
func ServingChecker(ready <-chan struct{}, host string, port int, certDir, dnsName string) healthz.Checker {
	return func(*http.Request) error {
		select {
		case <-ready:
		default:
			return errors.New("waiting for the webhook serving certificate and its caBundle")
		}
		ca, err := os.ReadFile(filepath.Join(certDir, CAFile))
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return fmt.Errorf("%s holds no certificate", filepath.Join(certDir, CAFile))
		}
		d := &net.Dialer{Timeout: 5 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(host, strconv.Itoa(port)), &tls.Config{
			RootCAs: pool, ServerName: dnsName, MinVersion: tls.VersionTLS12,
		})
		if err != nil {
			return fmt.Errorf("the webhook server does not serve a valid certificate for %s: %w", dnsName, err)
		}
		return conn.Close()
	}
}
