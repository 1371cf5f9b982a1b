// Package app wires the kmm operator (cmd/manager): the controller-runtime manager with its metrics endpoint,
// health probes, leader election, API client rate limits and the Module validating webhook. The
// controllers register here as they are added. cmd/manager parses flags into Options and calls New;
// tests call New against envtest.
package app

import (
	"flag"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers"
	"github.com/kmm-project/kmm/fsm"
	kmmwebhook "github.com/kmm-project/kmm/internal/webhook"
	"github.com/kmm-project/kmm/upgrade"
)

// The operator needs these permissions for leader election and Events; controllers declare theirs.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=kmm-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// LeaderElectionID names the Lease the operator replicas compete for.
const LeaderElectionID = "kmm-operator.kmm.sigs.x-k8s.io"

// Options are the operator's settings, one flag each.
type Options struct {
	MetricsAddr string
	ProbeAddr   string
	// PprofAddr serves net/http/pprof (profiling); empty or "0" disables it.
	PprofAddr            string
	LeaderElect          bool
	LeaderElectNamespace string
	QPS                  float64
	Burst                int
	WebhookHost          string
	WebhookPort          int
	WebhookCertDir       string
	DisableWebhook       bool
	// WorkerImage is the image of the worker pods.
	WorkerImage string
	// NMCConcurrency is how many nodes the NMC controller reconciles at once.
	NMCConcurrency int
	// DisableControllers runs only the webhook (for tests of admission alone).
	DisableControllers bool
	// BackOff is the retry policy after worker failures.
	BackOff fsm.BackOff
	// AllowRestartInProcess lets a process run a second manager after the first stopped (tests of
	// operator restarts): controller names are otherwise unique per process.
	AllowRestartInProcess bool
}

// DefaultOptions are the settings the flags start from.
func DefaultOptions() Options {
	return Options{
		MetricsAddr: ":8080",
		ProbeAddr:   ":8081",
		// Sized by the scale harness (docs/performance.md): 1,000 nodes x 3 Modules need a few
		// hundred writes per second while they load; the API server's priority and fairness
		// still protects it from a runaway operator.
		QPS:            500,
		Burst:          1000,
		WebhookPort:    9443,
		WorkerImage:    "kmm-worker:dev",
		NMCConcurrency: 16,
		BackOff:        fsm.DefaultBackOff,
	}
}

// BindFlags registers one flag per option on fs, with o's current values as defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr, "Address of the /healthz and /readyz endpoints; 0 disables them.")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, "Address of the net/http/pprof endpoints (/debug/pprof/); empty or 0 disables them.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect a leader so that only one replica reconciles.")
	fs.StringVar(&o.LeaderElectNamespace, "leader-elect-namespace", o.LeaderElectNamespace, "Namespace of the leader election Lease (default: the pod's namespace).")
	fs.Float64Var(&o.QPS, "kube-api-qps", o.QPS, "Sustained requests per second to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of requests to the API server above kube-api-qps.")
	fs.StringVar(&o.WebhookHost, "webhook-host", o.WebhookHost, "Address the admission webhook server listens on (default: all).")
	fs.IntVar(&o.WebhookPort, "webhook-port", o.WebhookPort, "Port of the admission webhook server.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", o.WebhookCertDir, "Directory holding tls.crt and tls.key for the webhook server.")
	fs.BoolVar(&o.DisableWebhook, "disable-webhook", o.DisableWebhook, "Do not serve the admission webhook (the CRD schema still validates).")
	fs.StringVar(&o.WorkerImage, "worker-image", o.WorkerImage, "Image of the worker pods that load and unload modules.")
	fs.IntVar(&o.NMCConcurrency, "nmc-concurrency", o.NMCConcurrency, "Nodes the NMC controller reconciles concurrently.")
	fs.DurationVar(&o.BackOff.Base, "worker-backoff", o.BackOff.Base, "Wait after a first worker failure; it doubles with each further failure.")
	fs.DurationVar(&o.BackOff.Max, "worker-backoff-max", o.BackOff.Max, "Longest wait between worker retries.")
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.QPS <= 0 || o.Burst <= 0 {
		return fmt.Errorf("kube-api-qps and kube-api-burst must be positive, got %v and %d", o.QPS, o.Burst)
	}
	if o.BackOff.Base <= 0 || o.BackOff.Max < o.BackOff.Base {
		return fmt.Errorf("worker-backoff must be positive and at most worker-backoff-max, got %v and %v", o.BackOff.Base, o.BackOff.Max)
	}
	if o.WorkerImage == "" || o.NMCConcurrency < 1 {
		return fmt.Errorf("worker-image must be set and nmc-concurrency at least 1, got %q and %d", o.WorkerImage, o.NMCConcurrency)
	}
	if !o.DisableWebhook && (o.WebhookPort <= 0 || o.WebhookPort > 65535) {
		return fmt.Errorf("webhook-port must be a TCP port, got %d", o.WebhookPort)
	}
	return nil
}

// NewScheme returns a scheme with the Kubernetes built-in kinds and the kmm kinds.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kmmv1beta1.AddToScheme(s))
	return s
}

// New builds the manager from cfg and o, with the webhook and health checks registered.
func New(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = float32(o.QPS), o.Burst

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  NewScheme(),
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectNamespace,
		Controller:              config.Controller{SkipNameValidation: ptr.To(o.AllowRestartInProcess)},
		Cache:                   cacheOptions(),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    o.WebhookHost,
			Port:    o.WebhookPort,
			CertDir: o.WebhookCertDir,
		}),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	if !o.DisableControllers {
		if err := setupControllers(mgr, o); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding the health check: %w", err)
	}
	readyCheck := healthz.Ping
	if !o.DisableWebhook {
		if err := kmmwebhook.SetupModuleWebhook(mgr); err != nil {
			return nil, fmt.Errorf("registering the Module webhook: %w", err)
		}
		readyCheck = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", readyCheck); err != nil {
		return nil, fmt.Errorf("adding the readiness check: %w", err)
	}
	return mgr, nil
}

// cacheOptions scope what the operator holds in memory: only its own pods (worker and device
// plugin pods), not every pod in the cluster; no object's managedFields (nothing reads them, and an
// NMC written by several Modules carries one entry per Module); no Node's image list.
func cacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:  {Label: labels.SelectorFromSet(labels.Set{contract.LabelManagedBy: contract.ManagedBy})},
			&corev1.Node{}: {Transform: stripNode},
		},
	}
}

// stripNode is the cache transform of Nodes: managedFields and the image list go (a node's list
// of cached images can be larger than the rest of it; kmm reads labels, taints, conditions and
// nodeInfo).
func stripNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
	}
	return obj, nil
}

// setupControllers registers the Module→NMC and NMC controllers.
func setupControllers(mgr ctrl.Manager, o Options) error {
	module := &controllers.ModuleReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("kmm-module")}
	if err := module.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Module controller: %w", err)
	}
	nmc := &controllers.NMCReconciler{
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorder("kmm-nmc"),
		Clock:                   clock.RealClock{},
		WorkerImage:             o.WorkerImage,
		BackOff:                 o.BackOff,
		MaxConcurrentReconciles: o.NMCConcurrency,
	}
	if err := nmc.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the NMC controller: %w", err)
	}
	labels := &upgrade.LabelReconciler{Client: mgr.GetClient()}
	if err := labels.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the version label controller: %w", err)
	}
	if err := (&upgrade.RolloutReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the automatic rollout controller: %w", err)
	}
	return nil
}
