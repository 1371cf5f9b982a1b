// Package envtest starts a real kube-apiserver and etcd (built into bin/ by `make tools`) with the kmm
// CRDs and webhook configuration installed, for integration tests, and on request
// kube-controller-manager and kube-scheduler. Start it once per test package from TestMain.
//
// It is the one control-plane starter of the harnesses (test/README.md): the testbed, the agent's
// tests, the demo, the scale and chaos harnesses, the install, takeover and preflight tests all
// start their plane with StartWith. Two build on it or beside it for what it cannot give: test/chaos
// replaces its etcd and kube-apiserver by restartable ones (and, for the highly available plane,
// by an etcd cluster and several kube-apiservers), and test/e2e starts a plane for a real kubelet
// (its certificates, Node authorizer and admission plugins); both reuse RepoRoot, AssetsDir,
// ComponentFlags, WriteKubeconfigFile and test/netport.
package envtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
)

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// WebhookHost, WebhookPort and WebhookCertDir are where the API server expects the kmm webhook.
	WebhookHost    string
	WebhookPort    int
	WebhookCertDir string

	env      *envtest.Environment
	assets   string
	stops    []func() error
	tempDirs []string
}

// Start starts etcd and kube-apiserver and installs config/crd and config/webhook.
func Start() (*Env, error) {
	return StartWith(Options{})
}

// Options change what StartWith starts and installs.
type Options struct {
	// Bare installs nothing: no CRDs, no webhook configuration (for tests that install kmm the
	// way an administrator does).
	Bare bool
	// NoWebhook installs the CRDs but no webhook configuration (for operators run without their
	// webhook, such as several replicas on one host).
	NoWebhook bool
	// APIServerFlags are set on kube-apiserver on top of envtest's defaults.
	APIServerFlags map[string]string
	// KubeControllers also starts kube-controller-manager (KubeControllers) and kube-scheduler, as
	// StartKubeControllers does.
	KubeControllers bool
	// StartTimeout is how long etcd and kube-apiserver may take to start (0: controlPlaneStart).
	StartTimeout time.Duration
}

// controlPlaneStart bounds the start (and the stop) of etcd and kube-apiserver.
const controlPlaneStart = 2 * time.Minute

// StartWith starts etcd and kube-apiserver as o says and, unless o.Bare, installs config/crd and
// config/webhook; with o.KubeControllers it then starts kube-controller-manager and kube-scheduler.
// On an error it stops whatever it started.
func StartWith(o Options) (*Env, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets, err := AssetsDir(root)
	if err != nil {
		return nil, err
	}
	// envtest's 20 s default to start the control plane is too short on a busy 2-core machine:
	// kube-apiserver took longer with the other core running a test (five retries, then "timeout
	// waiting for process kube-apiserver to start", no defect of kmm's). A start that needs more
	// than controlPlaneStart is a broken build, not a slow machine.
	start := o.StartTimeout
	if start == 0 {
		start = controlPlaneStart
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: start, ControlPlaneStopTimeout: controlPlaneStart}
	if !o.Bare {
		te.CRDDirectoryPaths = []string{filepath.Join(root, "config", "crd", "bases")}
		te.ErrorIfCRDPathMissing = true
		// With the webhook, envtest points the conversion webhook of every CRD whose kinds are
		// convertible in this scheme (PreflightValidation: v1beta1 ⇄ v1beta2) at the local webhook
		// server, as config/crd's patch points it at the Service; without it, v1beta1 reads of a
		// PreflightValidation are not converted.
		te.CRDInstallOptions.Scheme = runtime.NewScheme()
		if err := errors.Join(kmmv1beta1.AddToScheme(te.CRDInstallOptions.Scheme), kmmv1beta2.AddToScheme(te.CRDInstallOptions.Scheme)); err != nil {
			return nil, err
		}
	}
	if !o.Bare && !o.NoWebhook {
		te.WebhookInstallOptions = envtest.WebhookInstallOptions{
			Paths:            []string{filepath.Join(root, "config", "webhook", "manifests.yaml")},
			LocalServingHost: "127.0.0.1",
		}
	}
	args := te.ControlPlane.GetAPIServer().Configure()
	for k, v := range o.APIServerFlags {
		args.Set(k, v)
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err)
	}
	w := te.WebhookInstallOptions
	e := &Env{Config: cfg, WebhookHost: w.LocalServingHost, WebhookPort: w.LocalServingPort, WebhookCertDir: w.LocalServingCertDir, env: te, assets: assets}
	if o.KubeControllers {
		if err := e.StartKubeControllers(); err != nil {
			_ = e.Stop()
			return nil, err
		}
	}
	return e, nil
}

// Stop stops the control plane (and the kube controllers, if started) and removes its temporary files.
func (e *Env) Stop() error {
	return errors.Join(e.stopProcesses(), e.env.Stop())
}

// AssetsDir returns the directory holding etcd and kube-apiserver: $KUBEBUILDER_ASSETS when set,
// else the repository's bin/. It fails, naming the make target to run, when they are missing.
func AssetsDir(root string) (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(root, "bin")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s: run `make tools` in %s to build the local control plane", b, dir, root)
		}
	}
	return dir, nil
}

// RepoRoot returns the directory of the kmm go.mod, searching upwards from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "config", "crd")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the kmm repository root (a directory with go.mod and config/crd) above the working directory")
		}
		dir = parent
	}
}

// WriteKubeconfig writes a kubeconfig for the environment's API server (as its administrator) to
// dir/kubeconfig and returns its path, for binaries and plugins run against the environment.
func (e *Env) WriteKubeconfig(dir string) (string, error) {
	path := filepath.Join(dir, "kubeconfig")
	return path, WriteKubeconfigFile(path, "envtest", "admin", e.Config)
}

// WriteKubeconfigFile writes a kubeconfig for cfg (client certificate or token) to path: one
// cluster and one context named cluster, one user named user.
func WriteKubeconfigFile(path, cluster, user string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts[cluster] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: user}
	kc.CurrentContext = cluster
	return clientcmd.WriteToFile(*kc, path)
}
