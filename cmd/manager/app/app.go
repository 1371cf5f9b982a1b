// Package app wires the kmm operator (cmd/manager): the controller-runtime manager with its metrics endpoint,
// health probes, leader election, API client rate limits, the Module validating webhook and its
// serving certificate (internal/certs). The controllers register here as they are added.
// cmd/manager parses its command line with ParseArgs and calls New; tests call New against envtest,
// or ParseArgs with the arguments of the rendered install Deployment.
package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
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
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/contract"
	imagecontroller "github.com/kmm-project/kmm/controllers/image"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/controllers/node"
	preflightcontroller "github.com/kmm-project/kmm/controllers/preflight"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/certs"
	kmmwebhook "github.com/kmm-project/kmm/internal/webhook"
	"github.com/kmm-project/kmm/preflight"
	"github.com/kmm-project/kmm/upgrade"
)

// The operator needs these permissions for leader election and Events; controllers declare theirs.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=kmm-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// The secure metrics endpoint asks the API server who a scraper is and whether it may read /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// LeaderElectionID names the Lease the operator replicas compete for.
const LeaderElectionID = "kmm-operator.kmm.sigs.x-k8s.io"

// Options are the operator's settings, one flag each.
type Options struct {
	MetricsAddr string
	// MetricsSecure serves metrics over HTTPS to clients the API server authenticates and authorizes
	// (a bearer token allowed to get the /metrics non-resource URL); plain HTTP otherwise.
	MetricsSecure bool
	ProbeAddr     string
	// PprofAddr serves net/http/pprof (profiling); empty or "0" disables it.
	PprofAddr            string
	LeaderElect          bool
	LeaderElectNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod time the leader election (zero: controller-runtime's
	// 15 s, 10 s and 2 s). The chaos harness (test/chaos) shortens them to partition a replica
	// from the API server many times in one run.
	LeaseDuration  time.Duration
	RenewDeadline  time.Duration
	RetryPeriod    time.Duration
	QPS            float64
	Burst          int
	WebhookHost    string
	WebhookPort    int
	WebhookCertDir string
	DisableWebhook bool
	// CertManagement says who provides the webhook's serving certificate: certs.ModeSelf (kmm,
	// configured by Certs) or certs.ModeNone (files in WebhookCertDir, e.g. from cert-manager).
	CertManagement string
	// Certs configures the certificate kmm manages itself; its CertDir is WebhookCertDir.
	Certs certs.Options
	// WorkerImage is the image of the worker pods (and of the sign pods, `worker sign`).
	WorkerImage string
	// BuilderImage is the image of the build pods (BuildKit, docs/build.md).
	BuilderImage string
	// ImageCheckTimeout bounds the image controller's registry check of one image.
	ImageCheckTimeout time.Duration
	// WorkerDryRunSandbox, when set, makes every worker pod a dry run (modprobe -n) against this
	// host directory instead of the node's root (node.WorkerPodOptions): for hosts whose
	// kernel cannot load modules, such as demos and CI. Never on a cluster whose nodes should load
	// anything: a dry run loads nothing and still reports Loaded.
	WorkerDryRunSandbox string
	// FirmwareHostPath is the node directory worker pods copy firmware to; SetFirmwareClassPath
	// makes them write it to /sys/module/firmware_class/parameters/path (not needed for a directory
	// the kernel searches by default, such as /lib/firmware).
	FirmwareHostPath     string
	SetFirmwareClassPath bool
	// WorkerRegistry is the registry configuration worker pods pull with (docs/registries.md).
	WorkerRegistry node.WorkerRegistryOptions
	// NMCConcurrency is how many nodes the NMC controller reconciles at once. 16: in issue 41's
	// round three 32 made 5.03 writes per pair at 1,000 x 3, over SPEC §10's 5; in round four, with
	// a node's pairs folded into one reconcile, 24 and 32 kept the writes at 4.06-4.25 per pair but
	// were not faster (the front then waits on the Module controller's applies); 64 was slower
	// still (docs/performance.md).
	NMCConcurrency int
	// NMCCoalesceWindow is how long the NMC controller waits before reconciling a node after a new
	// spec entry or a worker pod's update, so that its other pairs' changes fold into one reconcile
	// (node.DefaultCoalesceWindow; 0 to 10 s, 0: not at all).
	NMCCoalesceWindow time.Duration
	// SecretsClusterWide says how the operator may read the Modules' pull secrets: through a
	// ClusterRoleBinding to kmm-secret-reader (config/default), or, when false, through a RoleBinding
	// in each Module namespace that an administrator creates (config/components/namespaced-secrets).
	// It changes only what a refused read tells the user to do (docs/install.md, Security).
	SecretsClusterWide bool
	// PreflightConcurrency is how many image checks a PreflightValidation runs at once;
	// PreflightCheckTimeout bounds each.
	PreflightConcurrency  int
	PreflightCheckTimeout time.Duration
	// DisableControllers runs only the webhook (for tests of admission alone).
	DisableControllers bool
	// BackOff is the retry policy after worker failures.
	BackOff fsm.BackOff
	// HandoverTimeout bounds the handover of upstream KMM's device plugin (docs/migration.md):
	// past it the Module is Degraded with reason DevicePluginHandoverStuck.
	HandoverTimeout time.Duration
	// OrphanGrace is how long an NMC spec entry of a Module that does not exist stays before the
	// Module→NMC controller removes it (the module is then unloaded).
	OrphanGrace time.Duration
	// AllowRestartInProcess lets a process run a second manager after the first stopped (tests of
	// operator restarts): controller names are otherwise unique per process.
	AllowRestartInProcess bool
	// Instrument is nil in production: no flag sets it and cmd/manager leaves it unset. A test
	// harness sets it to change the controller-runtime options just before New builds the manager
	// from them: test/chaos's seeded-bug manager (test/chaos/kmm-manager-seeded) wraps the client,
	// the cache and the leader election lock to plant its bugs. The lock it finds there is the bare
	// Lease lock; New puts the lease fence around the lock it leaves.
	Instrument func(*ctrl.Options)
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
		CertManagement: certs.ModeNone,
		Certs:          certs.DefaultOptions(),
		WorkerImage:    "kmm-worker:dev",
		BuilderImage:   "kmm-builder:dev",
		// the image controller: a HEAD per image, cut after 20 s like preflight's.
		ImageCheckTimeout: preflight.DefaultCheckTimeout,
		NMCConcurrency:    16,
		NMCCoalesceWindow: node.DefaultCoalesceWindow,
		// preflight: a HEAD per Module, a few at a time, each cut after 20 s.
		PreflightConcurrency:  preflight.DefaultConcurrency,
		PreflightCheckTimeout: preflight.DefaultCheckTimeout,
		BackOff:               fsm.DefaultBackOff,
		HandoverTimeout:       fsm.DefaultHandoverTimeout,
		OrphanGrace:           fsm.DefaultOrphanGrace,
		// kmm's default suits image-based OSes where /lib is read-only; upstream KMM's is
		// --firmware-host-path=/lib/firmware --set-firmware-class-path=false.
		FirmwareHostPath:     node.FirmwareHostPath,
		SetFirmwareClassPath: true,
		SecretsClusterWide:   true,
	}
}

// BindFlags registers one flag per option on fs, with o's current values as defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", o.MetricsAddr, "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", o.MetricsSecure, "Serve metrics over HTTPS, only to clients allowed to get /metrics (TokenReview and SubjectAccessReview); plain HTTP when false.")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", o.ProbeAddr, "Address of the /healthz and /readyz endpoints; 0 disables them.")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", o.PprofAddr, "Address of the net/http/pprof endpoints (/debug/pprof/); empty or 0 disables them.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect a leader so that only one replica reconciles.")
	fs.StringVar(&o.LeaderElectNamespace, "leader-elect-namespace", o.LeaderElectNamespace, "Namespace of the leader election Lease (default: the pod's namespace).")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "How long a replica waits, after the leader's last renewal, before it takes the Lease over (0: 15s).")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "How long the leader retries renewing its Lease before it stops leading and exits (0: 10s).")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "Wait between leader election attempts (0: 2s).")
	fs.Float64Var(&o.QPS, "kube-api-qps", o.QPS, "Sustained requests per second to the API server.")
	fs.IntVar(&o.Burst, "kube-api-burst", o.Burst, "Burst of requests to the API server above kube-api-qps.")
	fs.StringVar(&o.WebhookHost, "webhook-host", o.WebhookHost, "Address the admission webhook server listens on (default: all).")
	fs.IntVar(&o.WebhookPort, "webhook-port", o.WebhookPort, "Port of the admission webhook server.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", o.WebhookCertDir, "Directory holding tls.crt and tls.key for the webhook server.")
	fs.BoolVar(&o.DisableWebhook, "disable-webhook", o.DisableWebhook, "Do not serve the admission webhook (the CRD schema still validates).")
	fs.StringVar(&o.CertManagement, "cert-management", o.CertManagement, "Who provides the webhook's serving certificate: self (kmm creates and rotates it in --cert-secret-name and injects the caBundle) or none (tls.crt and tls.key in --webhook-cert-dir, e.g. from cert-manager).")
	fs.StringVar(&o.Certs.SecretName, "cert-secret-name", o.Certs.SecretName, "Secret holding the CA and the serving certificate kmm manages (--cert-management=self).")
	fs.StringVar(&o.Certs.Namespace, "cert-namespace", o.Certs.Namespace, "Namespace of that Secret and of the webhook Service.")
	fs.StringVar(&o.Certs.WebhookConfigName, "webhook-config-name", o.Certs.WebhookConfigName, "ValidatingWebhookConfiguration whose caBundle kmm keeps current (--cert-management=self).")
	fs.StringVar(&o.Certs.ServiceName, "webhook-service-name", o.Certs.ServiceName, "Service of the webhook: the certificate is for <service>.<cert-namespace>.svc.")
	fs.StringVar(&o.Certs.MetricsServiceName, "metrics-service-name", o.Certs.MetricsServiceName, "Service of the metrics endpoint: the certificate kmm manages also covers <service>.<cert-namespace>.svc, and --metrics-secure serves it; empty: the webhook's names only.")
	fs.BoolVar(&o.SecretsClusterWide, "secrets-cluster-wide", o.SecretsClusterWide, "The operator reads the Modules' pull secrets through a cluster-wide grant (ClusterRoleBinding kmm-secret-reader-rolebinding); false: through a RoleBinding per Module namespace, and a refused read names the RoleBinding to create.")
	fs.DurationVar(&o.Certs.Validity, "cert-validity", o.Certs.Validity, "How long a serving certificate kmm generates is valid.")
	fs.DurationVar(&o.Certs.RefreshBefore, "cert-refresh-before", o.Certs.RefreshBefore, "How long before its end a serving certificate (or the CA) is replaced.")
	fs.DurationVar(&o.Certs.CheckInterval, "cert-check-interval", o.Certs.CheckInterval, "How often kmm checks whether the certificate must be replaced.")
	fs.StringVar(&o.WorkerImage, "worker-image", o.WorkerImage, "Image of the worker pods that load and unload modules, and of the sign pods.")
	fs.StringVar(&o.BuilderImage, "builder-image", o.BuilderImage, "Image of the build pods that build a Module's kmod image from its Dockerfile (BuildKit).")
	fs.DurationVar(&o.ImageCheckTimeout, "image-check-timeout", o.ImageCheckTimeout, "Longest time the image controller's check of one image in its registry may take; slower is an error retried with back-off.")
	fs.StringVar(&o.WorkerDryRunSandbox, "worker-dry-run-sandbox", o.WorkerDryRunSandbox, "Absolute host directory: worker pods run modprobe in dry-run mode against it (their host paths below it) and load nothing. Only for hosts whose kernel cannot load modules (demos, CI).")
	fs.StringVar(&o.FirmwareHostPath, "firmware-host-path", o.FirmwareHostPath, "Node directory worker pods copy a Module's firmware to (upstream KMM: /lib/firmware).")
	fs.BoolVar(&o.SetFirmwareClassPath, "set-firmware-class-path", o.SetFirmwareClassPath, "Worker pods write firmware-host-path to /sys/module/firmware_class/parameters/path when they load a module with firmware (not needed for /lib/firmware).")
	o.bindRegistryFlags(fs)
	fs.IntVar(&o.NMCConcurrency, "nmc-concurrency", o.NMCConcurrency, "Nodes the NMC controller reconciles concurrently.")
	fs.DurationVar(&o.NMCCoalesceWindow, "nmc-coalesce-window", o.NMCCoalesceWindow, "How long the NMC controller waits before reconciling a node after a new spec entry or a worker pod's update, so that the node's other pairs fold into the same reconcile (0 to 10s; 0: not at all).")
	fs.IntVar(&o.PreflightConcurrency, "preflight-concurrency", o.PreflightConcurrency, "Image checks a PreflightValidation runs at once.")
	fs.DurationVar(&o.PreflightCheckTimeout, "preflight-check-timeout", o.PreflightCheckTimeout, "Longest time one PreflightValidation image check may take; a registry slower than that is RegistryUnreachable.")
	fs.DurationVar(&o.BackOff.Base, "worker-backoff", o.BackOff.Base, "Wait after a first worker failure; it doubles with each further failure.")
	fs.DurationVar(&o.BackOff.Max, "worker-backoff-max", o.BackOff.Max, "Longest wait between worker retries.")
	fs.DurationVar(&o.HandoverTimeout, "device-plugin-handover-timeout", o.HandoverTimeout, "How long upstream KMM's device plugin may wait for kmm's to be Ready on its nodes before the Module is Degraded (DevicePluginHandoverStuck); upstream's stays meanwhile.")
	fs.DurationVar(&o.OrphanGrace, "orphaned-entry-grace", o.OrphanGrace, "How long an NMC spec entry of a Module that does not exist (left by upstream KMM) is kept before it is removed and the module unloaded.")
}

// bindRegistryFlags registers the flags of the worker pods' registry configuration.
func (o *Options) bindRegistryFlags(fs *flag.FlagSet) {
	r := &o.WorkerRegistry
	fs.StringVar(&r.ContainerdConfigPath, "worker-containerd-config-path", r.ContainerdConfigPath, "containerd's config_path on the nodes (e.g. /etc/containerd/certs.d): worker pods mount it read-only and honour its hosts.toml files (mirrors, CAs, skip_verify).")
	fs.StringVar(&r.RegistriesConf, "worker-registries-conf", r.RegistriesConf, "The nodes' registries.conf (e.g. /etc/containers/registries.conf, CRI-O): worker pods mount it read-only and honour its mirrors, blocked and insecure registries.")
	fs.Func("worker-certs-dirs", "Comma-separated certs.d directories of the nodes (e.g. /etc/containers/certs.d): <dir>/<host[:port]>/*.crt are trusted for that registry.", listInto(&r.CertsDirs))
	fs.Func("worker-registry-ca-dirs", "Comma-separated node directories mounted read-only into worker pods so that hosts.toml ca paths outside the config_path resolve.", listInto(&r.CADirs))
	fs.StringVar(&r.RegistriesConfigMap, "worker-registries-configmap", r.RegistriesConfigMap, "ConfigMap (key registries.conf) in each Module's namespace, consulted before the nodes' files; optional per namespace.")
	fs.StringVar(&r.CABundleConfigMap, "worker-ca-bundle-configmap", r.CABundleConfigMap, "ConfigMap (key ca-bundle.crt) in each Module's namespace whose CA certificates worker pods trust for every registry (e.g. one trust-manager distributes); optional per namespace.")
	fs.StringVar(&r.CredentialProviderConfig, "worker-credential-provider-config", r.CredentialProviderConfig, "The nodes' kubelet CredentialProviderConfig file: worker pods run its plugins (credentialprovider.kubelet.k8s.io/v1) for registry credentials.")
	fs.StringVar(&r.CredentialProviderBinDir, "worker-credential-provider-bin-dir", r.CredentialProviderBinDir, "The nodes' directory of credential provider plugins (kubelet --image-credential-provider-bin-dir).")
}

// listInto appends the comma-separated values of a flag to list.
func listInto(list *[]string) func(string) error {
	return func(v string) error {
		for _, e := range strings.Split(v, ",") {
			if e != "" {
				*list = append(*list, e)
			}
		}
		return nil
	}
}

// validateHostPaths checks the node directories worker pods use.
func (o *Options) validateHostPaths() error {
	if s := o.FirmwareHostPath; !path.IsAbs(s) || path.Clean(s) == "/" {
		return fmt.Errorf("firmware-host-path must be an absolute host directory other than /, got %q", s)
	}
	if s := o.WorkerDryRunSandbox; s != "" && (!path.IsAbs(s) || path.Clean(s) == "/") {
		return fmt.Errorf("worker-dry-run-sandbox must be an absolute host directory other than /, got %q", s)
	}
	return o.WorkerRegistry.Validate()
}

// validateLeaderElection checks the leader election timing: each set value positive, the lease
// duration in whole seconds, and the renew deadline between the retry period and the lease
// duration.
func (o *Options) validateLeaderElection() error {
	ld, rd, rp := o.LeaseDuration, o.RenewDeadline, o.RetryPeriod
	if ld < 0 || rd < 0 || rp < 0 {
		return fmt.Errorf("leader-elect-lease-duration, -renew-deadline and -retry-period must not be negative, got %v, %v and %v", ld, rd, rp)
	}
	// client-go writes the lease duration into the Lease in whole seconds, and the other replicas
	// wait what the Lease says: 1.5s would let them take over after 1s, and the lease fence's
	// margin (lease duration - renew deadline) would shrink without a word.
	if ld%time.Second != 0 {
		return fmt.Errorf("leader-elect-lease-duration must be a whole number of seconds (the Lease records it in seconds), got %v", ld)
	}
	ld, rd, rp = cmp.Or(ld, 15*time.Second), cmp.Or(rd, 10*time.Second), cmp.Or(rp, 2*time.Second)
	if rd >= ld || rp >= rd {
		return fmt.Errorf("leader election needs retry period < renew deadline < lease duration, got %v, %v and %v", rp, rd, ld)
	}
	return nil
}

// MaxNMCCoalesceWindow bounds --nmc-coalesce-window: every node waits up to the window after a
// new spec entry and after its worker pods' updates.
const MaxNMCCoalesceWindow = 10 * time.Second

// validateWork checks the settings of the work the controllers do: worker back-off, preflight
// checks, the worker image and the NMC concurrency.
func (o *Options) validateWork() error {
	if o.BackOff.Base <= 0 || o.BackOff.Max < o.BackOff.Base {
		return fmt.Errorf("worker-backoff must be positive and at most worker-backoff-max, got %v and %v", o.BackOff.Base, o.BackOff.Max)
	}
	if o.PreflightConcurrency < 1 || o.PreflightCheckTimeout <= 0 {
		return fmt.Errorf("preflight-concurrency must be at least 1 and preflight-check-timeout positive, got %d and %v", o.PreflightConcurrency, o.PreflightCheckTimeout)
	}
	if o.BuilderImage == "" || o.ImageCheckTimeout <= 0 {
		return fmt.Errorf("builder-image must be set and image-check-timeout positive, got %q and %s", o.BuilderImage, o.ImageCheckTimeout)
	}
	if o.WorkerImage == "" || o.NMCConcurrency < 1 {
		return fmt.Errorf("worker-image must be set and nmc-concurrency at least 1, got %q and %d", o.WorkerImage, o.NMCConcurrency)
	}
	if o.NMCCoalesceWindow < 0 || o.NMCCoalesceWindow > MaxNMCCoalesceWindow {
		return fmt.Errorf("nmc-coalesce-window must be 0 to %v, got %v", MaxNMCCoalesceWindow, o.NMCCoalesceWindow)
	}
	return nil
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.QPS <= 0 || o.Burst <= 0 {
		return fmt.Errorf("kube-api-qps and kube-api-burst must be positive, got %v and %d", o.QPS, o.Burst)
	}
	if err := o.validateWork(); err != nil {
		return err
	}
	if err := o.validateHostPaths(); err != nil {
		return err
	}
	if err := o.validateLeaderElection(); err != nil {
		return err
	}
	if o.DisableWebhook {
		return nil
	}
	if o.WebhookPort <= 0 || o.WebhookPort > 65535 {
		return fmt.Errorf("webhook-port must be a TCP port, got %d", o.WebhookPort)
	}
	switch o.CertManagement {
	case certs.ModeNone:
		return nil
	case certs.ModeSelf:
		return o.certOptions().Validate()
	default:
		return fmt.Errorf("cert-management must be %s or %s, got %q", certs.ModeSelf, certs.ModeNone, o.CertManagement)
	}
}

// selfManagedCerts says whether kmm provisions the webhook's certificate itself.
func (o *Options) selfManagedCerts() bool {
	return !o.DisableWebhook && o.CertManagement == certs.ModeSelf
}

// managersInProcess numbers the managers a process builds, so that each has its own certificate
// rotator controller name (AllowRestartInProcess).
var managersInProcess atomic.Int32

func (o *Options) certOptions() certs.Options {
	c := o.Certs
	c.CertDir = o.webhookCertDir()
	return c
}

// webhookCertDir is --webhook-cert-dir, or controller-runtime's default when it is empty.
func (o *Options) webhookCertDir() string {
	if o.WebhookCertDir != "" {
		return o.WebhookCertDir
	}
	return filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")
}

// Args is cmd/manager's command line: the Options and the flags of the process itself.
type Args struct {
	Options
	// Kubeconfig is a kubeconfig path; empty: $KUBECONFIG, in-cluster config, then ~/.kube/config.
	Kubeconfig string
	LogLevel   string
	LogConsole bool
}

// ParseArgs parses cmd/manager's arguments (without the program name) over DefaultOptions. The
// binary and the install tests, which run the arguments of the rendered Deployment, share it.
func ParseArgs(args []string) (Args, error) {
	a := Args{Options: DefaultOptions(), LogLevel: "info"}
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	a.BindFlags(fs)
	fs.StringVar(&a.Kubeconfig, "kubeconfig", a.Kubeconfig, "Path to a kubeconfig; default: $KUBECONFIG, in-cluster config, then ~/.kube/config.")
	fs.StringVar(&a.LogLevel, "log-level", a.LogLevel, "Log level: debug, info, warn or error.")
	fs.BoolVar(&a.LogConsole, "log-console", a.LogConsole, "Log human-readable text instead of JSON.")
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	if fs.NArg() != 0 {
		return a, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return a, nil
}

// startupBackoff bounds how long New waits for the API server while it builds the manager: 9
// tries, 250 ms doubling to at most 8 s between them, about 32 s in all (docs/install.md).
var startupBackoff = wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 9, Cap: 8 * time.Second}

// newManagerWaiting builds the manager, trying again with startupBackoff while it fails. Building it
// reads the API server's discovery (the cache's REST mapping of every kind it holds); a discovery
// request that fails (a kube-apiserver restarting, 429 or 5xx from priority and fairness, a CRD
// not yet in discovery) would otherwise end the process at once, and a replica restarted during
// an outage would crash-loop instead of becoming a standby. Nothing is bound or started before
// the discovery, so a failed try leaves nothing behind.
func newManagerWaiting(cfg *rest.Config, opts ctrl.Options) (ctrl.Manager, error) {
	var mgr ctrl.Manager
	tries := 0
	err := retry.OnError(startupBackoff, func(error) bool { return true }, func() error {
		tries++
		var err error
		if mgr, err = ctrl.NewManager(cfg, opts); err != nil {
			ctrl.Log.Info("Creating the manager failed; trying again", "try", tries, "error", err.Error())
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("creating the manager (%d tries): %w", tries, err)
	}
	return mgr, nil
}

// NewScheme returns a scheme with the Kubernetes built-in kinds and the kmm kinds.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(kmmv1beta1.AddToScheme(s))
	utilruntime.Must(kmmv1beta2.AddToScheme(s))
	return s
}

// New builds the manager from cfg and o, with the webhook and health checks registered. With
// --cert-management=self it creates the certificate Secret when it is missing (an API call), and
// the webhook server, the readiness check and the controllers wait for the certificate.
func New(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = float32(o.QPS), o.Burst

	leaseEvents := &lateEvents{}
	certOpts := o.certOptions()
	if o.AllowRestartInProcess {
		certOpts.ControllerName = fmt.Sprintf("%s-%d", certOpts.ControllerName, managersInProcess.Add(1))
	}
	mgrOpts, err := managerOptions(cfg, o, certOpts, leaseEvents)
	if err != nil {
		return nil, err
	}
	mgr, err := newManagerWaiting(cfg, mgrOpts)
	if err != nil {
		return nil, err
	}
	leaseEvents.bind(mgr)
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding the health check: %w", err)
	}
	controllerMgr := ctrl.Manager(mgr)
	readyCheck := healthz.Ping
	switch {
	case o.DisableWebhook:
	case o.selfManagedCerts():
		certsReady, err := setupSelfManagedCerts(cfg, mgr, certOpts)
		if err != nil {
			return nil, err
		}
		readyCheck = certs.ServingChecker(certsReady, o.WebhookHost, o.WebhookPort, certOpts.CertDir, certOpts.DNSName())
		// The Module controller writes Modules (its finalizer), which the API server sends
		// through the webhook: the controllers start once it can answer.
		controllerMgr = gatedManager{Manager: mgr, gate: certsReady}
	default:
		if err := kmmwebhook.SetupWebhooks(mgr); err != nil {
			return nil, fmt.Errorf("registering the webhooks: %w", err)
		}
		readyCheck = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", readyCheck); err != nil {
		return nil, fmt.Errorf("adding the readiness check: %w", err)
	}
	if !o.DisableControllers {
		if err := setupControllers(controllerMgr, o); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// managerOptions are the controller-runtime options New builds the manager with: metrics, probes,
// leader election with its fenced Lease lock (fence.go), the cache's scope, the webhook server;
// then Options.Instrument's changes, if any. It wraps cfg's transport with the lease fence.
func managerOptions(cfg *rest.Config, o Options, certOpts certs.Options, events *lateEvents) (ctrl.Options, error) {
	metrics := metricsserver.Options{BindAddress: o.MetricsAddr}
	if o.MetricsSecure {
		// Who may read is decided by the API server's TokenReview and SubjectAccessReview.
		metrics.SecureServing = true
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
		if !o.DisableWebhook {
			// The webhook's serving certificate (kmm's or cert-manager's), which also covers the
			// metrics Service (--metrics-service-name): a scraper verifies it with the CA of the
			// certificate Secret (config/prometheus). Without a webhook, controller-runtime's
			// self-signed certificate (local runs).
			fc := &certs.FileCertificate{Dir: o.webhookCertDir()}
			metrics.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.GetCertificate = fc.GetCertificate }}
		}
	}
	lock, fence, err := leaderElection(cfg, o, events)
	if err != nil {
		return ctrl.Options{}, err
	}
	opts := ctrl.Options{
		Scheme:                  NewScheme(),
		Metrics:                 metrics,
		HealthProbeBindAddress:  o.ProbeAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectNamespace,
		// A stopping operator (its pod deleted, a rollout) gives the Lease up once its controllers
		// have stopped, so the next replica leads at once instead of after the lease duration
		// (15 s). On make e2e's real node the load a deleted operator pod left was Loaded 6.7 s
		// after the deletion, 17.5 s without.
		// The process exits when Start returns, so nothing runs on after the release.
		LeaderElectionReleaseOnCancel:       true,
		LeaseDuration:                       nonZero(o.LeaseDuration),
		RenewDeadline:                       nonZero(o.RenewDeadline),
		RetryPeriod:                         nonZero(o.RetryPeriod),
		LeaderElectionResourceLockInterface: lock,
		Controller:                          config.Controller{SkipNameValidation: ptr.To(o.AllowRestartInProcess)},
		Cache:                               cacheOptions(o, certOpts),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    o.WebhookHost,
			Port:    o.WebhookPort,
			CertDir: o.webhookCertDir(),
		}),
	}
	if o.Instrument != nil {
		o.Instrument(&opts)
	}
	if fence != nil {
		// Last, so that the fence follows the lock the manager uses, whatever Instrument wrapped
		// around it.
		opts.LeaderElectionResourceLockInterface = fence.Lock(opts.LeaderElectionResourceLockInterface)
	}
	return opts, nil
}

// nonZero is &d, or nil (controller-runtime's default) when d is zero.
func nonZero(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// setupSelfManagedCerts creates the certificate Secret when missing, adds the rotator, and
// registers the webhook (which starts the webhook server) once the certificate is in the
// directory and the caBundle injected. The returned channel is closed then.
func setupSelfManagedCerts(cfg *rest.Config, mgr ctrl.Manager, o certs.Options) (<-chan struct{}, error) {
	c, err := client.New(cfg, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := certs.EnsureSecret(ctx, c, o); err != nil {
		return nil, err
	}
	certsReady, err := certs.Setup(mgr, o)
	if err != nil {
		return nil, err
	}
	registered := make(chan struct{})
	register := manager.RunnableFunc(func(ctx context.Context) error {
		select {
		case <-certsReady:
		case <-ctx.Done():
			return nil
		}
		// The webhook server reads the certificate files when it starts, on this first call.
		if err := kmmwebhook.SetupWebhooks(mgr); err != nil {
			return fmt.Errorf("registering the webhooks: %w", err)
		}
		ctrl.Log.WithName("certs").Info("The webhook serving certificate is in place: serving the Module webhook", "dnsName", o.DNSName())
		close(registered)
		return nil
	})
	if err := mgr.Add(noLeaderElection{register}); err != nil {
		return nil, err
	}
	return registered, nil
}

// noLeaderElection runs a runnable on every replica.
type noLeaderElection struct{ manager.Runnable }

// NeedLeaderElection is false: every replica serves the webhook.
func (noLeaderElection) NeedLeaderElection() bool { return false }

// gatedManager is a manager whose runnables start only once gate is closed; the controllers are
// set up through it so that they wait for the webhook.
type gatedManager struct {
	ctrl.Manager
	gate <-chan struct{}
}

// Add adds r, to be started once the gate is open.
func (g gatedManager) Add(r manager.Runnable) error {
	return g.Manager.Add(gatedRunnable{Runnable: r, gate: g.gate})
}

// gatedRunnable waits for gate, then runs the runnable; it keeps the runnable's leader election need.
type gatedRunnable struct {
	manager.Runnable
	gate <-chan struct{}
}

// Start waits for the gate, then starts the runnable.
func (g gatedRunnable) Start(ctx context.Context) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil
	}
	return g.Runnable.Start(ctx)
}

// NeedLeaderElection is the wrapped runnable's (true when it does not say).
func (g gatedRunnable) NeedLeaderElection() bool {
	if le, ok := g.Runnable.(manager.LeaderElectionRunnable); ok {
		return le.NeedLeaderElection()
	}
	return true
}

// cacheOptions scope what the operator holds in memory: only its own pods (worker and device
// plugin pods), not every pod in the cluster; no object's managedFields (nothing reads them, and an
// NMC written by several Modules carries one entry per Module); no Node's image list.
// Secrets: only those of the operator's namespace (--cert-namespace), and with self-managed
// certificates only the certificate Secret. Nothing reads other Secrets from the cache (the pull
// secrets are read uncached, one get each); should something try, the cache refuses instead of
// starting a cluster-wide list and watch of Secrets, which the operator may not do.
func cacheOptions(o Options, c certs.Options) cache.Options {
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:  {Label: labels.SelectorFromSet(labels.Set{contract.LabelManagedBy: contract.ManagedBy})},
			&corev1.Node{}: {Transform: stripNode},
		},
	}
	if o.selfManagedCerts() {
		opts.ByObject[&corev1.Secret{}] = c.SecretCache()
	} else if c.Namespace != "" {
		opts.ByObject[&corev1.Secret{}] = cache.ByObject{Namespaces: map[string]cache.Config{c.Namespace: {}}}
	}
	return opts
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

// setupControllers registers the Module→NMC, image, NMC, version label, rollout and PreflightValidation
// controllers.
func setupControllers(mgr ctrl.Manager, o Options) error {
	modules := &module.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("kmm-module"),
		HandoverTimeout: o.HandoverTimeout, OrphanGrace: o.OrphanGrace}
	if err := modules.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the Module controller: %w", err)
	}
	nmc := &node.NMCReconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("kmm-nmc"),
		Clock:     clock.RealClock{},
		Worker: node.WorkerPodOptions{
			Image:                  o.WorkerImage,
			DryRunSandbox:          o.WorkerDryRunSandbox,
			FirmwareHostPath:       o.FirmwareHostPath,
			LeaveFirmwareClassPath: !o.SetFirmwareClassPath,
			Registry:               o.WorkerRegistry,
		},
		BackOff:                 o.BackOff,
		MaxConcurrentReconciles: o.NMCConcurrency,
		CoalesceWindow:          o.NMCCoalesceWindow,
	}
	if err := nmc.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the NMC controller: %w", err)
	}
	images := &imagecontroller.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("kmm-image"),
		Registry: preflight.Registry{Timeout: o.ImageCheckTimeout}, WorkerImage: o.WorkerImage, BuilderImage: o.BuilderImage, RegistrySettings: o.WorkerRegistry}
	if err := images.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the image controller: %w", err)
	}
	labels := &upgrade.LabelReconciler{Client: mgr.GetClient()}
	if err := labels.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the version label controller: %w", err)
	}
	if err := (&upgrade.RolloutReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("kmm-rollout")}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the automatic rollout controller: %w", err)
	}
	pfv := &preflightcontroller.Reconciler{
		Client:      mgr.GetClient(),
		APIReader:   mgr.GetAPIReader(),
		Recorder:    mgr.GetEventRecorder("kmm-preflight"),
		Registry:    preflight.Registry{Timeout: o.PreflightCheckTimeout},
		Concurrency: o.PreflightConcurrency,

		SecretsNamespaced: !o.SecretsClusterWide,
	}
	if err := pfv.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the PreflightValidation controller: %w", err)
	}
	return nil
}
