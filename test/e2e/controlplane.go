package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	kmmenvtest "github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/netport"
)

// apiServerFlags are the kube-apiserver flags a real node needs on top of envtest's defaults
// (which already allow privileged pods and set the service-account key pair and issuer).
func apiServerFlags(serviceCIDR string) map[string][]string {
	return map[string][]string{
		// The default reconciler publishes the advertise address as the endpoint of the kubernetes
		// Service and exits at start on 127.0.0.1 ("may not be in the loopback range").
		"endpoint-reconciler-type": {"none"},
		// The kubelet is a node: the Node authorizer and NodeRestriction limit it to its own objects.
		"authorization-mode":       {"Node,RBAC"},
		"enable-admission-plugins": {"NodeRestriction"},
		// envtest disables the ServiceAccount admission plugin; pods need it for their token volume.
		"disable-admission-plugins": nil,
		// With no kube-proxy, a Service's ClusterIP leads nowhere; with this the API server calls
		// webhooks (and aggregated APIs) at an endpoint of the Service instead, e.g. the node IP of a
		// hostNetwork operator pod.
		"enable-aggregator-routing": {"true"},
		"service-cluster-ip-range":  {serviceCIDR},
		// The node's InternalIP, never its hostname: a name lookup would go to the machine's resolver.
		"kubelet-preferred-address-types": {"InternalIP"},
		"allow-privileged":                {"true"},
	}
}

// newEnvironment prepares envtest's etcd and kube-apiserver with their files and logs in the
// cluster's folder and the flags a real node needs.
func (c *Cluster) newEnvironment(extra map[string][]string) (*envtest.Environment, error) {
	var logs []*os.File
	for _, name := range []string{"kube-apiserver", "etcd"} {
		f, err := os.Create(filepath.Join(c.LogDir(), name+".log"))
		if err != nil {
			return nil, err
		}
		c.closers = append(c.closers, f)
		logs = append(logs, f)
	}
	certDir, etcdDir := filepath.Join(c.Dir, "apiserver"), filepath.Join(c.Dir, "etcd")
	for _, d := range []string{certDir, etcdDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	var err error
	if c.kubeletClient, err = writeKubeletClientCerts(filepath.Join(c.Dir, "kubelet-client")); err != nil {
		return nil, err
	}
	api := &envtest.APIServer{CertDir: certDir, Out: logs[0], Err: logs[0]}
	flags := apiServerFlags(serviceCIDR)
	flags["kubelet-client-certificate"] = []string{c.kubeletClient.Cert}
	flags["kubelet-client-key"] = []string{c.kubeletClient.Key}
	maps.Copy(flags, extra)
	for k, v := range flags {
		api.Configure().Set(k, v...)
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: c.assets,
		ControlPlane: envtest.ControlPlane{
			APIServer: api,
			Etcd:      &envtest.Etcd{DataDir: etcdDir, Out: logs[1], Err: logs[1]},
		},
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}, nil
}

// startControlPlane starts etcd and kube-apiserver through envtest, then kube-controller-manager
// and kube-scheduler, with their files and logs in the cluster's folder.
//
// It is not test/envtest's StartWith, which every other harness starts its plane with: a real
// kubelet needs what that plane leaves out — kube-apiserver's client certificate for the kubelet
// API (and its RBAC binding), the Node authorizer and NodeRestriction, the ServiceAccount admission
// plugin, a service CIDR; every controller (`*`) with the root CA and the service-account signing
// key; certificates, etcd data and logs in the cluster's folder, which the cleanup command and a
// failed run's logs rely on; and readiness read from /healthz and the controllers' first work
// rather than a fixed wait. It reuses that package's pieces: AssetsDir, ComponentFlags,
// WriteKubeconfigFile, and test/netport for the ports.
func (c *Cluster) startControlPlane(ctx context.Context, extra map[string][]string) error {
	env, err := c.newEnvironment(extra)
	if err != nil {
		return err
	}
	c.env = env
	certDir := env.ControlPlane.APIServer.CertDir
	cfg, err := c.env.Start()
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver (see %s): %w", c.LogDir(), err)
	}
	c.config = cfg
	if c.clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	if err := writeKubeconfig(c.KubeconfigPath(), cfg); err != nil {
		return err
	}
	if err := c.bindKubeletClient(ctx); err != nil {
		return err
	}
	caFile := filepath.Join(certDir, "serving-ca.crt")
	if err := os.WriteFile(caFile, cfg.CAData, 0o600); err != nil {
		return err
	}
	kc, err := c.userKubeconfig("kube-controllers", "system:kube-controllers", "system:masters")
	if err != nil {
		return err
	}
	if c.kcm, err = c.startComponent("kube-controller-manager", kc,
		"--leader-elect=false", "--controllers=*", "--root-ca-file="+caFile,
		"--service-account-private-key-file="+filepath.Join(certDir, "sa-signer.key"),
		"--service-cluster-ip-range="+serviceCIDR); err != nil {
		return err
	}
	if c.scheduler, err = c.startComponent("kube-scheduler", kc, "--leader-elect=false"); err != nil {
		return err
	}
	// The controllers are ready when the service-account and root CA controllers have done their
	// work in the default namespace: a pod there gets its token volume and its CA.
	cs := c.clientset
	return c.kcm.waitReady(ctx, time.Minute, func() error {
		if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err
		}
		_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	})
}

// bindKubeletClient lets the API server's kubelet client user use the kubelet's API (the kubelet
// asks the API server through a SubjectAccessReview).
func (c *Cluster) bindKubeletClient(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kmm-e2e:" + kubeletClientUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubeletClientUser}},
	}
	_, err := c.clientset.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	return err
}

// userKubeconfig provisions a client-certificate user and writes its kubeconfig into the cluster's
// folder, returning the path.
func (c *Cluster) userKubeconfig(file, user string, groups ...string) (string, error) {
	u, err := c.env.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("provisioning user %s: %w", user, err)
	}
	path := filepath.Join(c.Dir, file+".kubeconfig")
	return path, writeKubeconfig(path, u.Config())
}

// startComponent starts kube-controller-manager or kube-scheduler on a free loopback port and
// waits for its /healthz.
func (c *Cluster) startComponent(name, kubeconfig string, args ...string) (*process, error) {
	port, err := netport.Free("127.0.0.1")
	if err != nil {
		return nil, err
	}
	args = append(args, kmmenvtest.ComponentFlags(kubeconfig, port)...)
	args = append(args, "--cert-dir="+filepath.Join(c.Dir, name))
	p, err := startProcess(c.LogDir(), name, filepath.Join(c.assets, name), args...)
	if err != nil {
		return nil, err
	}
	// Its serving certificate is self-signed; this is a health probe of our own child on loopback.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // G402: see above
	healthz := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	return p, p.waitReady(context.Background(), time.Minute, func() error {
		resp, err := client.Get(healthz)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", healthz, resp.Status)
		}
		return nil
	})
}

// writeKubeconfig writes a kubeconfig for cfg (client certificate or token) to path.
func writeKubeconfig(path string, cfg *rest.Config) error {
	return kmmenvtest.WriteKubeconfigFile(path, "e2e", "user", cfg)
}

// hostNetworkEnv is the environment a hostNetwork pod needs for its in-cluster configuration to
// reach the API server: with no kube-proxy the kubernetes Service's ClusterIP leads nowhere.
func hostNetworkEnv(cfg *rest.Config) ([]corev1.EnvVar, error) {
	u, err := neturl.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	return []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: u.Hostname()}, {Name: "KUBERNETES_SERVICE_PORT", Value: u.Port()}}, nil
}
