package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	kmmenvtest "github.com/kmm-project/kmm/test/envtest"
)

// DefaultNodeName is the name of the node when Options leave it empty.
const DefaultNodeName = "kmm-e2e-node"

// Options configure Start.
type Options struct {
	// NodeName is the node's name (DefaultNodeName when empty).
	NodeName string
	// APIServerFlags are kube-apiserver flags set over the cluster's own; a nil value drops a flag.
	APIServerFlags map[string][]string
}

// Cluster is a running control plane with one real node. Its methods are safe for concurrent use
// once Start has returned.
type Cluster struct {
	// Dir is the cluster's folder: daemon state, certificates, the node's root, and the logs
	// (LogDir, kept by Stop with the pods' logs).
	Dir string

	nodeName  string
	assets    string
	env       *envtest.Environment
	config    *rest.Config
	clientset *kubernetes.Clientset
	registry  *imageRegistry

	kubeletClient kubeletClientCerts

	containerd, kubelet, kcm, scheduler *process
	closers                             []io.Closer
	// guests are stopped first: a guest kubelet's watches keep kube-apiserver from stopping
	// within its grace period.
	guests []io.Closer

	before  map[string]string // the host before Start
	stopped bool
}

// Start brings a cluster up in dir (created if missing; a record of a cluster that died there is
// cleaned up first): the node's links, the registry with the pause image, etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd and the kubelet. It returns once the node is
// registered (WaitNodeReady waits for Ready). It needs root, the binaries of `make tools` and
// bin/kubelet, and the Debian packages containerd, runc and containernetworking-plugins. On error
// it has stopped whatever it started and undone its host side effects.
func Start(ctx context.Context, dir string, opts Options) (_ *Cluster, err error) {
	c, err := prepare(dir, opts)
	if err != nil {
		return nil, err
	}
	dir = c.Dir
	c.before = hostSnapshot()
	if _, err := takeRecord(dir, []string{nodeLink, bridgeLink}, [][]string{{"unreachable", netRange}}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	if err := setUpLinks(); err != nil {
		return nil, err
	}
	if c.registry, err = startRegistry(c.LogDir(), nodeIP); err != nil {
		return nil, err
	}
	pause, err := GoBinaryImage(ctx, filepath.Join(dir, "bin"), "github.com/kmm-project/kmm/test/e2e/pause")
	if err != nil {
		return nil, err
	}
	if _, err := c.PushImage(pauseRepo, pause); err != nil {
		return nil, err
	}
	if err := c.startControlPlane(ctx, opts.APIServerFlags); err != nil {
		return nil, err
	}
	cniDir, err := c.writeCNIConfig()
	if err != nil {
		return nil, err
	}
	if err := c.startContainerd(ctx, cniDir); err != nil {
		return nil, err
	}
	return c, c.startKubelet(ctx)
}

// prepare checks the host and the binaries and cleans up after a cluster that died in dir.
func prepare(dir string, opts Options) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := Cleanup(dir); err != nil {
		return nil, fmt.Errorf("cleaning up after the cluster that died in %s: %w", dir, err)
	}
	c := &Cluster{Dir: dir, nodeName: opts.NodeName}
	if c.nodeName == "" {
		c.nodeName = DefaultNodeName
	}
	withSbinPath()
	if c.assets, err = findAssets(); err != nil {
		return nil, err
	}
	if err := checkHost(); err != nil {
		return nil, err
	}
	return c, os.MkdirAll(c.LogDir(), 0o750)
}

// findAssets returns the directory holding the control plane (`make tools`) and the kubelet.
func findAssets() (string, error) {
	root, err := kmmenvtest.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := kmmenvtest.AssetsDir(root)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "kubelet")); err != nil {
		return "", fmt.Errorf("kubelet not found in %s: run `make e2e` (it builds bin/kubelet)", dir)
	}
	return dir, nil
}

// checkHost fails early, naming what to install, when the node cannot run here.
func checkHost() error {
	if os.Geteuid() != 0 {
		return errors.New("the e2e node needs root (mounts, cgroups, network links)")
	}
	for _, bin := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found: install the Debian packages containerd runc iproute2 (make e2e does)", bin)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return errors.New("/usr/lib/cni/bridge not found: install the Debian package containernetworking-plugins (make e2e does)")
	}
	if roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(roots) > 0 {
		return fmt.Errorf("%s exists: another kubelet runs (or ran) on this host; the e2e node would share its cgroups", roots[0])
	}
	return nil
}

// Stop tears the cluster down: the kubelet, the pods' processes, containerd, the controllers, the
// API server and etcd, the registry; then Cleanup undoes the host side effects, and everything in
// Dir but the logs (LogDir and pod-logs/) is removed. It fails when the host is not left as Start
// found it, naming what differs. Stop is idempotent.
func (c *Cluster) Stop() error {
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	for _, g := range c.guests {
		errs = append(errs, g.Close())
	}
	errs = append(errs, c.kubelet.stop(15*time.Second), killPods(), c.containerd.stop(15*time.Second),
		c.scheduler.stop(10*time.Second), c.kcm.stop(10*time.Second))
	if c.env != nil && c.config != nil {
		errs = append(errs, c.env.Stop())
	}
	errs = append(errs, c.registry.stop())
	for _, cl := range c.closers {
		errs = append(errs, cl.Close())
	}
	errs = append(errs, Cleanup(c.Dir))
	entries, _ := os.ReadDir(c.Dir)
	for _, e := range entries {
		if !slices.Contains([]string{"logs", "pod-logs"}, e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(c.Dir, e.Name())))
		}
	}
	if c.before != nil {
		errs = append(errs, diffSnapshots(c.before, hostSnapshot()))
	}
	return errors.Join(errs...)
}

// LogDir holds the logs of etcd, kube-apiserver, the controllers, containerd, the kubelet and the
// registry; the containers' logs are in Dir/pod-logs.
func (c *Cluster) LogDir() string { return filepath.Join(c.Dir, "logs") }

// Config returns a copy of the administrator's client configuration (group system:masters).
func (c *Cluster) Config() *rest.Config { return rest.CopyConfig(c.config) }

// Clientset returns a client-go clientset as the administrator.
func (c *Cluster) Clientset() kubernetes.Interface { return c.clientset }

// Client returns a controller-runtime client as the administrator with the given scheme.
func (c *Cluster) Client(scheme *runtime.Scheme) (client.Client, error) {
	return client.New(c.Config(), client.Options{Scheme: scheme})
}

// KubeconfigPath is a kubeconfig file for the administrator (for kubectl and kubectl-kmm).
func (c *Cluster) KubeconfigPath() string { return filepath.Join(c.Dir, "admin.kubeconfig") }

// NodeName is the name of the node.
func (c *Cluster) NodeName() string { return c.nodeName }

// NodeIP is the node's InternalIP: the address of a hostNetwork pod, and the host as pods on the
// pod network reach it.
func (c *Cluster) NodeIP() string { return nodeIP }

// RegistryAddr is the registry's host:port on 127.0.0.1, for image references the node pulls
// (containerd pulls over plain HTTP from it).
func (c *Cluster) RegistryAddr() string { return fmt.Sprintf("127.0.0.1:%d", c.registry.port) }

// NodeRegistryAddr is the same registry on the node IP, for image references that a pod on the
// pod network pulls itself (kmm's worker pulls kmod images): such a pod cannot reach 127.0.0.1 of
// the host.
func (c *Cluster) NodeRegistryAddr() string { return fmt.Sprintf("%s:%d", nodeIP, c.registry.port) }

// PushImage pushes img to the registry as repoTag ("kmm/worker:e2e") and returns its reference
// through RegistryAddr ("127.0.0.1:PORT/kmm/worker:e2e"); the same image is at NodeRegistryAddr.
func (c *Cluster) PushImage(repoTag string, img v1.Image) (string, error) {
	return c.registry.push(repoTag, img, nil)
}

// PushLayout pushes the OCI image layout at path (as `make images` writes them) as repoTag: its one
// image, or its index when it holds several manifests.
func (c *Cluster) PushLayout(repoTag, path string) (string, error) {
	img, idx, err := readLayout(path)
	if err != nil {
		return "", err
	}
	return c.registry.push(repoTag, img, idx)
}

// HostNetworkEnv is what a hostNetwork pod (the operator) sets in its container's env for its
// in-cluster configuration to reach the API server: KUBERNETES_SERVICE_HOST=127.0.0.1 and the
// port. The Service ClusterIP the kubelet injects leads nowhere without kube-proxy; the API
// server's certificate is valid for 127.0.0.1 and the pod's service-account CA (kube-root-ca.crt)
// is its CA.
func (c *Cluster) HostNetworkEnv() []corev1.EnvVar {
	env, err := hostNetworkEnv(c.config)
	if err != nil {
		panic(err) // the Host of a rest.Config envtest made
	}
	return env
}

// PauseImage is the reference of the pod sandbox image in the registry (a FROM-scratch image
// whose process waits for SIGTERM): also a container that runs until deleted.
func (c *Cluster) PauseImage() string { return c.RegistryAddr() + "/" + pauseRepo }
