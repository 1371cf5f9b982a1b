package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kmm-project/kmm/test/netport"
)

// The node's network, all of it on links the cluster creates: the node IP on one end of a veth
// pair (the kubelet refuses a loopback node IP, and this kernel has no dummy links) and the pods on
// a CNI bridge. Everything else in netRange is unreachable: with no kube-proxy a Service's
// ClusterIP (serviceCIDR) leads nowhere, and no packet for these addresses may leave the machine.
const (
	nodeLink    = "kmme2e0"
	nodePeer    = "kmme2e1"
	netRange    = "10.77.0.0/16"
	bridgeLink  = "kmme2ebr0"
	nodeIP      = "10.77.0.1"
	podCIDR     = "10.77.1.0/24"
	podGateway  = "10.77.1.1"
	serviceCIDR = "10.77.2.0/24"
	cniNetwork  = "kmm-e2e"
	// pauseRepo is the pod sandbox image, pushed to the registry at Start.
	pauseRepo = "kmm-e2e/pause:1"
)

// setUpLinks creates the veth pair with the node IP and makes the rest of netRange unreachable.
func setUpLinks() error {
	for _, l := range []string{nodeLink, bridgeLink} {
		if _, err := os.Stat(filepath.Join("/sys/class/net", l)); err == nil {
			return fmt.Errorf("network link %s exists: another e2e cluster runs here, or one died without cleanup (run bin/e2e-cleanup on its folder)", l)
		}
	}
	for _, show := range [][]string{{"-o", "addr", "show", "to", netRange}, {"route", "show", "root", netRange}} {
		if out, err := runOut("ip", show...); err != nil || strings.TrimSpace(out) != "" {
			return fmt.Errorf("ip %s: %q (%v): the e2e node's network would clash", strings.Join(show, " "), strings.TrimSpace(out), err)
		}
	}
	for _, args := range [][]string{
		{"link", "add", nodeLink, "type", "veth", "peer", "name", nodePeer},
		{"addr", "add", nodeIP + "/32", "dev", nodeLink},
		{"link", "set", nodeLink, "up"},
		{"link", "set", nodePeer, "up"},
		{"route", "add", "unreachable", netRange},
	} {
		if err := run("ip", args...); err != nil {
			return err
		}
	}
	return nil
}

func runOut(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output() //nolint:gosec // G204: ip with arguments we build
	return string(out), err
}

// writeCNIConfig writes the bridge network: host-local addresses from podCIDR with their data in
// the folder, a route to the node IP only (no default route: a pod reaches the node and the other
// pods, nothing else), no masquerading.
func (c *Cluster) writeCNIConfig() (string, error) {
	dir := filepath.Join(c.Dir, "cni", "net.d")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", err
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       cniNetwork,
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": bridgeLink, "isGateway": true, "ipMasq": false, "hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": filepath.Join(c.Dir, "cni", "ipam"),
				"ranges":  [][]map[string]string{{{"subnet": podCIDR, "gateway": podGateway}}},
				"routes":  []map[string]string{{"dst": nodeIP + "/32"}},
			},
		}},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "10-kmm-e2e.conflist"), data, 0o600)
}

// containerdConfig is containerd's configuration (version 2): root, state, socket and plugin
// paths in the folder; the sandbox image from the local registry; runc with cgroupfs;
// restrict_oom_score_adj because root here lacks CAP_SYS_RESOURCE (runc fails with "can't get final
// child's PID from pipe: EOF" when a sandbox asks for oom_score_adj -998); the registry hosts over
// plain HTTP through config_path.
const containerdConfig = `version = 2
root = "{{dir}}/containerd/root"
state = "{{dir}}/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{{socket}}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{dir}}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{sandbox}}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{{dir}}/containerd/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{{cni}}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{{dir}}/containerd/certs.d"
`

// startContainerd writes containerd's configuration and the registry hosts and starts it.
func (c *Cluster) startContainerd(ctx context.Context, cniDir string) error {
	base := filepath.Join(c.Dir, "containerd")
	files := map[string]string{}
	for _, host := range []string{c.RegistryAddr(), c.NodeRegistryAddr()} {
		files[host] = fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", host)
	}
	// MirroredRegistry does not exist: its images come from the mirror at the node IP, tried
	// first, the way an air-gapped cluster configures containerd.
	files[MirroredRegistry] = fmt.Sprintf("[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", c.NodeRegistryAddr())
	// Readable by all, as containerd's hosts.toml files are on a node: kmm's sign pods (non-root)
	// mount them with the worker's registry settings and read them.
	for host, hosts := range files {
		d := filepath.Join(c.ContainerdConfigPath(), host)
		if err := os.MkdirAll(d, 0o755); err != nil { //nolint:gosec // G301: read by non-root pods, as on a node
			return err
		}
		if err := os.Chmod(c.ContainerdConfigPath(), 0o755); err != nil { //nolint:gosec // G302: read by non-root pods, as on a node
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(hosts), 0o644); err != nil { //nolint:gosec // G306: read by non-root pods, as on a node
			return err
		}
	}
	conf := strings.NewReplacer("{{dir}}", c.Dir, "{{socket}}", c.containerdSocket(), "{{sandbox}}", c.RegistryAddr()+"/"+pauseRepo, "{{cni}}", cniDir).Replace(containerdConfig)
	confPath := filepath.Join(base, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	p, err := startProcess(c.LogDir(), "containerd", "containerd", "--config", confPath)
	if err != nil {
		return err
	}
	c.containerd = p
	return p.waitReady(ctx, 30*time.Second, func() error {
		conn, err := net.Dial("unix", c.containerdSocket())
		if err == nil {
			_ = conn.Close()
		}
		return err
	})
}

// MirroredRegistry is a registry name that resolves nowhere; containerd's hosts.toml for it (in
// ContainerdConfigPath) names the registry at the node IP as its mirror.
const MirroredRegistry = "kmm-origin.e2e.invalid"

// ContainerdConfigPath is the node's containerd config_path (registry hosts.toml files).
func (c *Cluster) ContainerdConfigPath() string {
	return filepath.Join(c.Dir, "containerd", "certs.d")
}

func (c *Cluster) containerdSocket() string {
	return filepath.Join(c.Dir, "containerd", "containerd.sock")
}

// kubeletConfig is the KubeletConfiguration of the node (see docs/e2e.md for each setting).
func (c *Cluster) kubeletConfig(port, healthzPort int) map[string]any {
	return map[string]any{
		"apiVersion":                  "kubelet.config.k8s.io/v1beta1",
		"kind":                        "KubeletConfiguration",
		"address":                     nodeIP,
		"port":                        port,
		"readOnlyPort":                0,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 healthzPort,
		"cgroupDriver":                "cgroupfs",
		"failCgroupV1":                false, // the kubelet refuses cgroup v1, the only hierarchy here, otherwise
		"failSwapOn":                  false,
		"containerRuntimeEndpoint":    "unix://" + c.containerdSocket(),
		"oomScoreAdj":                 0, // root here lacks CAP_SYS_RESOURCE: no negative scores
		"makeIPTablesUtilChains":      false,
		"podLogsDir":                  filepath.Join(c.Dir, "pod-logs"),
		"resolvConf":                  "",
		"serializeImagePulls":         false,
		"evictionHard":                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": c.kubeletClient.CA},
		},
		"authorization": map[string]any{"mode": "Webhook"},
	}
}

// startKubelet writes the kubelet's configuration and credentials (user system:node:<name> in
// group system:nodes) and starts it; it returns once the Node is registered.
func (c *Cluster) startKubelet(ctx context.Context) error {
	base := filepath.Join(c.Dir, "kubelet")
	for _, d := range []string{filepath.Join(base, "root"), filepath.Join(base, "pki"), filepath.Join(c.Dir, "pod-logs")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	kc, err := c.userKubeconfig("kubelet", "system:node:"+c.nodeName, "system:nodes")
	if err != nil {
		return err
	}
	port, err := netport.Free(nodeIP)
	if err != nil {
		return err
	}
	healthz, err := netport.Free("127.0.0.1")
	if err != nil {
		return err
	}
	data, err := yaml.Marshal(c.kubeletConfig(port, healthz))
	if err != nil {
		return err
	}
	confPath := filepath.Join(base, "config.yaml")
	if err := os.WriteFile(confPath, data, 0o600); err != nil {
		return err
	}
	p, err := startProcess(c.LogDir(), "kubelet", filepath.Join(c.assets, "kubelet"),
		"--config="+confPath, "--kubeconfig="+kc, "--root-dir="+filepath.Join(base, "root"),
		"--cert-dir="+filepath.Join(base, "pki"), "--hostname-override="+c.nodeName, "--node-ip="+nodeIP, "--v=2")
	if err != nil {
		return err
	}
	c.kubelet = p
	return p.waitReady(ctx, time.Minute, func() error {
		_, err := c.clientset.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return errors.New("node not registered yet")
		}
		return err
	})
}
