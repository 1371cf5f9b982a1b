package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/u-root/u-root/pkg/cpio"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kmm-project/kmm/test/e2e/kernelview"
	"github.com/kmm-project/kmm/test/netport"
	"github.com/kmm-project/kmm/test/vm"
)

// qemu's user network (slirp): the guest's address, and the host's loopback as the guest sees it.
const (
	GuestIP      = "10.0.2.15"
	guestHostIP  = "10.0.2.2"
	guestPodCIDR = "10.88.0.0/24"
	// observerPort is the guest init's observer, forwarded by qemu to a port of the host's loopback.
	observerPort = 8099
	// DefaultGuestName is the guest node's name when GuestOptions leave it empty.
	DefaultGuestName = "kmm-e2e-guest"
	// guestBootTimeout bounds a boot: qemu started → the node registered (about 12 s on an idle
	// 2-core machine under TCG; three times that with both cores busy).
	guestBootTimeout = 3 * time.Minute
)

// GuestOptions configure StartGuest.
type GuestOptions struct {
	// Name is the node's name (DefaultGuestName when empty).
	Name string
	// Kernels are the kernels the guest can boot; it boots the first. The initramfs holds the
	// module tree of each (/lib/modules/<release>).
	Kernels []*DebianKernel
	// MemoryMiB is the guest's memory (2048 when 0).
	MemoryMiB int
}

// Guest is a qemu guest (TCG) joined to the cluster as a second, real node: a stock Debian kernel,
// containerd, runc, the CNI plugins, kmod and the kubelet, all from an initramfs (test/e2e/guest
// is its init). It reaches the API server and the registry on the host through qemu's user
// network; the API server cannot reach its kubelet (no logs, no exec: pods report through their
// termination message). Its kernel's view is read through the init's observer (kernelview).
type Guest struct {
	c       *Cluster
	name    string
	dir     string
	initrd  string
	memory  int
	obsPort int
	http    *http.Client

	mu      sync.Mutex
	kernel  *DebianKernel
	qemu    *exec.Cmd
	exited  chan error
	console *os.File
	boots   int
}

// StartGuest builds the guest's initramfs, boots the first kernel of opts and returns once the
// node is registered. Needs qemu-system-x86 and the Debian packages of the host node (containerd,
// runc, containernetworking-plugins, kmod), busybox-static is downloaded.
func (c *Cluster) StartGuest(ctx context.Context, opts GuestOptions) (*Guest, error) {
	if len(opts.Kernels) == 0 {
		return nil, errors.New("StartGuest: no kernel")
	}
	g := &Guest{c: c, name: opts.Name, dir: filepath.Join(c.Dir, "guest"), memory: opts.MemoryMiB,
		http: &http.Client{Timeout: 30 * time.Second}}
	if g.name == "" {
		g.name = DefaultGuestName
	}
	if g.memory == 0 {
		g.memory = 2048
	}
	if err := os.MkdirAll(g.dir, 0o750); err != nil {
		return nil, err
	}
	var err error
	if g.obsPort, err = netport.Free("127.0.0.1"); err != nil {
		return nil, err
	}
	if g.initrd, err = g.buildInitramfs(opts.Kernels); err != nil {
		return nil, fmt.Errorf("building the guest's initramfs: %w", err)
	}
	c.guests = append(c.guests, g)
	return g, g.Boot(ctx, opts.Kernels[0])
}

// Name is the guest node's name.
func (g *Guest) Name() string { return g.name }

// Kernel is the kernel the guest runs (or ran last).
func (g *Guest) Kernel() *DebianKernel {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kernel
}

// RegistryAddr is the registry as pods on the guest reach it: the node IP, forwarded by the
// guest init to the host.
func (g *Guest) RegistryAddr() string { return fmt.Sprintf("%s:%d", GuestIP, g.c.registry.port) }

// Boot starts qemu with the kernel and the initramfs and returns once the node is registered
// with this boot's ID (a boot ID another boot reported does not count).
func (g *Guest) Boot(ctx context.Context, k *DebianKernel) error {
	g.mu.Lock()
	if g.qemu != nil {
		g.mu.Unlock()
		return errors.New("the guest is running")
	}
	old := g.nodeBootID(ctx)
	g.boots++
	console, err := os.OpenFile(filepath.Join(g.c.LogDir(), "guest-console.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		g.mu.Unlock()
		return err
	}
	_, _ = fmt.Fprintf(console, "\n===== boot %d: %s =====\n", g.boots, k.Release)
	args := []string{
		"-accel", vm.QemuAccel, "-m", fmt.Sprint(g.memory), "-smp", fmt.Sprint(vm.QemuCPUs), "-nographic", "-no-reboot",
		"-kernel", k.Vmlinuz, "-initrd", g.initrd,
		"-append", "console=ttyS0 panic=-1 rdinit=/init",
		"-nic", fmt.Sprintf("user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:%d-%s:%d", g.obsPort, GuestIP, observerPort),
	}
	cmd := exec.Command("qemu-system-x86_64", args...) //nolint:gosec // G204: our own arguments
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = console.Close()
		g.mu.Unlock()
		return fmt.Errorf("starting qemu: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	g.qemu, g.exited, g.console, g.kernel = cmd, exited, console, k
	g.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, guestBootTimeout)
	defer cancel()
	for {
		n, err := g.c.clientset.CoreV1().Nodes().Get(ctx, g.name, metav1.GetOptions{})
		if err == nil && n.Status.NodeInfo.BootID != "" && n.Status.NodeInfo.BootID != old && n.Status.NodeInfo.KernelVersion == k.Release {
			return nil
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("qemu exited during boot %d (%v): see %s; its last lines:\n%s", g.boots, err, console.Name(), fileTail(console.Name(), consoleTailLines))
		case <-ctx.Done():
			return fmt.Errorf("the guest node %s did not register boot %d (%s) within %s: see %s; its last lines:\n%s",
				g.name, g.boots, k.Release, guestBootTimeout, console.Name(), fileTail(console.Name(), consoleTailLines))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// nodeBootID is the boot ID the node reports now ("" when there is no node).
func (g *Guest) nodeBootID(ctx context.Context) string {
	n, err := g.c.clientset.CoreV1().Nodes().Get(ctx, g.name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return n.Status.NodeInfo.BootID
}

// Reboot reboots the guest (reboot(2) in the guest; qemu runs with -no-reboot, so it ends and is
// started again like a machine's firmware would) into the kernel k, and returns once the node
// registered the new boot. The guest's daemons' logs of the ending boot are saved first.
func (g *Guest) Reboot(ctx context.Context, k *DebianKernel) error {
	g.saveLogs()
	if err := g.post(kernelview.PathReboot); err != nil {
		return err
	}
	if err := g.waitExit(2 * time.Minute); err != nil {
		return err
	}
	return g.Boot(ctx, k)
}

// waitExit waits for qemu to end.
func (g *Guest) waitExit(timeout time.Duration) error {
	g.mu.Lock()
	exited, cmd := g.exited, g.qemu
	g.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case werr := <-exited:
		_ = werr // a powered-off guest: qemu's status says nothing more
	case <-time.After(timeout):
		return fmt.Errorf("qemu still running %s after the guest was asked to reboot", timeout)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	_ = g.console.Close()
	g.qemu, g.exited = nil, nil
	return nil
}

// Close saves the guest's logs and stops qemu (Cluster.Stop calls it).
func (g *Guest) Close() error {
	g.mu.Lock()
	cmd, exited := g.qemu, g.exited
	g.mu.Unlock()
	if cmd == nil {
		return nil
	}
	g.saveLogs()
	_ = g.post(kernelview.PathPowerOff)
	select {
	case werr := <-exited:
		_ = werr // powered off
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		werr := <-exited
		_ = werr // killed by us
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	_ = g.console.Close()
	g.qemu, g.exited = nil, nil
	return nil
}

// saveLogs copies the guest's containerd and kubelet logs of this boot to the log folder.
func (g *Guest) saveLogs() {
	for _, name := range []string{"containerd", "kubelet"} {
		resp, err := g.http.Get(g.url(kernelview.PathLog + name))
		if err != nil {
			continue
		}
		f, err := os.Create(filepath.Join(g.c.LogDir(), fmt.Sprintf("guest-%s-boot%d.log", name, g.boots)))
		if err == nil {
			_, _ = io.Copy(f, resp.Body)
			_ = f.Close()
		}
		_ = resp.Body.Close()
	}
}

func (g *Guest) url(p string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", g.obsPort, p) }

func (g *Guest) post(p string) error {
	resp, err := g.http.Post(g.url(p), "text/plain", nil)
	if err != nil {
		return fmt.Errorf("asking the guest for %s: %w", p, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("asking the guest for %s: %s", p, resp.Status)
	}
	return nil
}

// State is the guest kernel's view of the named modules (and its release, boot ID and firmware
// class path), read by the guest init from /proc and /sys.
func (g *Guest) State(modules ...string) (kernelview.State, error) {
	q := url.Values{"module": modules}
	var s kernelview.State
	resp, err := g.http.Get(g.url(kernelview.PathState + "?" + q.Encode()))
	if err != nil {
		return s, err
	}
	defer func() { _ = resp.Body.Close() }()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// Kmsg is the guest kernel's log so far, one message a line.
func (g *Guest) Kmsg() (string, error) {
	resp, err := g.http.Get(g.url(kernelview.PathKmsg))
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// NodeReady says whether the guest node's Ready condition is True.
func (g *Guest) NodeReady(ctx context.Context) (bool, string) {
	n, err := g.c.clientset.CoreV1().Nodes().Get(ctx, g.name, metav1.GetOptions{})
	if err != nil {
		return false, err.Error()
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue, fmt.Sprintf("node %s Ready=%s: %s", g.name, cond.Status, cond.Message)
		}
	}
	return false, "no Ready condition"
}

// guestBinaries are the host's files (from Debian packages the test installs, and bin/kubelet)
// copied into the initramfs at the same path, with the shared libraries ldd names.
func (g *Guest) guestBinaries() map[string]string {
	return map[string]string{
		"/usr/bin/containerd":              "/usr/bin/containerd",
		"/usr/bin/containerd-shim-runc-v2": "/usr/bin/containerd-shim-runc-v2",
		"/usr/sbin/runc":                   "/usr/sbin/runc",
		"/usr/lib/cni/bridge":              "/usr/lib/cni/bridge",
		"/usr/lib/cni/host-local":          "/usr/lib/cni/host-local",
		"/usr/lib/cni/loopback":            "/usr/lib/cni/loopback",
		"/usr/bin/kmod":                    "/usr/bin/kmod",
		"/usr/local/bin/kubelet":           filepath.Join(g.c.assets, "kubelet"),
	}
}

// busyboxApplets are linked to busybox in /bin: what the kubelet and the init run (mount for the
// kubelet's tmpfs volumes, ip for the network) and a shell.
var busyboxApplets = []string{"sh", "mount", "umount", "ip", "cat", "ls", "sleep", "sync", "mkdir", "rm", "echo",
	"ps", "grep", "du", "find", "nice", "ionice", "sed", "tail", "head", "mv", "cp", "ln", "chmod", "touch", "nsenter", "uname", "df"}

// buildInitramfs stages the guest's root file system and writes it as an uncompressed newc cpio
// archive.
func (g *Guest) buildInitramfs(kernels []*DebianKernel) (string, error) {
	root := filepath.Join(g.dir, "root")
	_ = os.RemoveAll(root)
	put := func(p string, data []byte, mode os.FileMode) error {
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
			return err
		}
		return os.WriteFile(dst, data, mode)
	}
	link := func(target, p string) error {
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	// The init, built static.
	initBin := filepath.Join(g.dir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, "github.com/kmm-project/kmm/test/e2e/guest") //nolint:gosec // G204: our own package
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build test/e2e/guest: %w: %s", err, out)
	}
	if err := copyInto(initBin, filepath.Join(root, "init")); err != nil {
		return "", err
	}
	if err := g.stageBusybox(root, link); err != nil {
		return "", err
	}
	if err := g.stageBinaries(root, link); err != nil {
		return "", err
	}
	// The kernels' module trees, with depmod's output.
	for _, k := range kernels {
		dst := filepath.Join(root, "lib", "modules", k.Release)
		if err := copyTree(k.Modules, dst); err != nil {
			return "", err
		}
		if out, err := exec.Command(depmod(), "-b", root, k.Release).CombinedOutput(); err != nil { //nolint:gosec // G204: our own depmod run
			return "", fmt.Errorf("depmod for %s: %w: %s", k.Release, err, out)
		}
	}
	files, err := g.configFiles()
	if err != nil {
		return "", err
	}
	for p, data := range files {
		if err := put(p, data, 0o600); err != nil {
			return "", err
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "var/lib", "var/log", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o750); err != nil {
			return "", err
		}
	}
	file := filepath.Join(g.dir, "initramfs.cpio")
	return file, writeCpio(root, file)
}

// stageBusybox extracts busybox-static from its Debian package into root with busyboxApplets.
func (g *Guest) stageBusybox(root string, link func(target, p string) error) error {
	// busybox-static, from its Debian package.
	bbDir := filepath.Join(g.dir, "busybox")
	debs, err := aptDownload(g.dir, "busybox-static")
	if err != nil {
		return err
	}
	if err := extractDeb(debs[0], bbDir, func(n string) bool { return n == "/bin/busybox" }); err != nil {
		return err
	}
	if err := copyInto(filepath.Join(bbDir, "bin", "busybox"), filepath.Join(root, "bin", "busybox")); err != nil {
		return err
	}
	for _, a := range busyboxApplets {
		if err := link("busybox", "/bin/"+a); err != nil {
			return err
		}
	}
	return nil
}

// stageBinaries copies guestBinaries and the libraries they need into root, and links kmod's tools.
func (g *Guest) stageBinaries(root string, link func(target, p string) error) error {
	libs := map[string]bool{}
	for dst, src := range g.guestBinaries() {
		if err := copyInto(src, filepath.Join(root, dst)); err != nil {
			return err
		}
		l, err := sharedLibraries(src)
		if err != nil {
			return err
		}
		for _, lib := range l {
			libs[lib] = true
		}
	}
	for lib := range libs {
		if err := copyInto(lib, filepath.Join(root, lib)); err != nil {
			return err
		}
	}
	for _, tool := range []string{"modprobe", "depmod", "insmod", "rmmod", "lsmod", "modinfo"} {
		if err := link("../bin/kmod", "/usr/sbin/"+tool); err != nil {
			return err
		}
	}
	return nil
}

// lddPath matches the absolute paths in ldd's output.
var lddPath = regexp.MustCompile(`(^|\s)(/\S+)`)

func sharedLibraries(binary string) ([]string, error) {
	out, err := exec.Command("ldd", binary).CombinedOutput() //nolint:gosec // G204: a binary of ours
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", binary, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := lddPath.FindStringSubmatch(sc.Text()); m != nil {
			libs = append(libs, m[2])
		}
	}
	return libs, nil
}

// copyInto copies the file src (following links) to dst, keeping its permission bits.
func copyInto(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
		return err
	}
	return os.WriteFile(dst, data, st.Mode().Perm())
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o750)
		case d.Type()&fs.ModeSymlink != 0: // the headers' build link: not the guest's
			return nil
		}
		return copyInto(p, filepath.Join(dst, rel))
	})
}

// writeCpio writes the tree root as an uncompressed newc archive, reproducibly.
func writeCpio(root, file string) error {
	recs := []cpio.Record{cpio.Directory("dev", 0o755), cpio.CharDev("dev/console", 0o600, 5, 1)}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "dev" {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		perm := uint64(info.Mode().Perm())
		switch {
		case d.IsDir():
			recs = append(recs, cpio.Directory(name, perm))
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			recs = append(recs, cpio.Symlink(name, target))
		default:
			data, err := os.ReadFile(p) //nolint:gosec // G304: the staged tree
			if err != nil {
				return err
			}
			recs = append(recs, cpio.StaticRecord(data, cpio.Info{Name: name, Mode: cpio.S_IFREG | perm}))
		}
		return nil
	})
	if err != nil {
		return err
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	w := cpio.Newc.Writer(bw)
	cpio.MakeAllReproducible(recs)
	err = errors.Join(cpio.WriteRecords(w, recs), cpio.WriteTrailer(w), bw.Flush())
	return errors.Join(err, f.Close())
}

// configFiles are the guest's configuration: the init's, containerd's (with the registry hosts),
// the CNI network's, the kubelet's with its credentials.
func (g *Guest) configFiles() (map[string][]byte, error) {
	port := g.c.registry.port
	files := map[string][]byte{}
	// containerd pulls the images of kmm's install by their 127.0.0.1 reference and the pods'
	// images at the node IP: both are forwarded to the host by the init, over plain HTTP.
	for _, host := range []string{fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("%s:%d", GuestIP, port)} {
		files["/etc/containerd/certs.d/"+host+"/hosts.toml"] = fmt.Appendf(nil, "server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", host)
	}
	files["/etc/containerd/config.toml"] = []byte(strings.NewReplacer("{{sandbox}}", g.c.PauseImage()).Replace(guestContainerdConfig))
	cni := map[string]any{
		"cniVersion": "1.0.0", "name": "kmm-guest",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": "kmmguestbr0", "isGateway": true, "ipMasq": false,
			"ipam": map[string]any{
				"type": "host-local", "ranges": [][]map[string]string{{{"subnet": guestPodCIDR}}},
				"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}},
	}
	var err error
	if files["/etc/cni/net.d/10-kmm-guest.conflist"], err = json.Marshal(cni); err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(g.c.kubeletClient.CA)
	if err != nil {
		return nil, err
	}
	files["/etc/kubernetes/client-ca.crt"] = ca
	kc, err := g.kubeconfig()
	if err != nil {
		return nil, err
	}
	files["/etc/kubernetes/kubelet.kubeconfig"] = kc
	if files["/etc/kubernetes/kubelet.yaml"], err = yaml.Marshal(guestKubeletConfig()); err != nil {
		return nil, err
	}
	files["/etc/passwd"] = []byte("root:x:0:0:root:/root:/bin/sh\n")
	files["/etc/hosts"] = []byte("127.0.0.1 localhost\n") // containerd copies it into each sandbox
	files["/etc/resolv.conf"] = []byte("")
	files["/etc/group"] = []byte("root:x:0:\n")
	init := map[string]any{
		"nodeName": g.name, "guestIP": GuestIP, "hostIP": guestHostIP, "bootModules": guestBootModules,
		"forwardPorts": []int{port}, "observerPort": observerPort,
		"containerd": []string{"--config", "/etc/containerd/config.toml", "--address", "/run/containerd/containerd.sock"},
		"kubelet": []string{"--config=/etc/kubernetes/kubelet.yaml", "--kubeconfig=/etc/kubernetes/kubelet.kubeconfig",
			"--root-dir=/var/lib/kubelet", "--cert-dir=/var/lib/kubelet/pki", "--hostname-override=" + g.name,
			"--node-ip=" + GuestIP, "--v=1"},
	}
	if files["/etc/kmm-guest/config.json"], err = json.Marshal(init); err != nil {
		return nil, err
	}
	return files, nil
}

// kubeconfig is the guest kubelet's: user system:node:<name> (group system:nodes) with a client
// certificate, the API server at the host's loopback as the guest reaches it, its certificate
// checked against the name it has (127.0.0.1).
func (g *Guest) kubeconfig() ([]byte, error) {
	u, err := g.c.env.AddUser(envtest.User{Name: "system:node:" + g.name, Groups: []string{"system:nodes"}}, nil)
	if err != nil {
		return nil, err
	}
	cfg := u.Config()
	server, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	tlsName := server.Hostname()
	server.Host = fmt.Sprintf("%s:%s", guestHostIP, server.Port())
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server.String(), CertificateAuthorityData: cfg.CAData, TLSServerName: tlsName}
	kc.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "node"}
	kc.CurrentContext = "e2e"
	return clientcmd.Write(*kc)
}

// guestContainerdConfig is containerd's configuration in the guest (version 2): the native
// snapshotter (the root file system is the initramfs), runc without pivot_root (pivot_root(2)
// refuses the initramfs as the old root), no AppArmor profile (the guest has no apparmor_parser),
// the sandbox image from the host's registry, the registry hosts from config_path.
const guestContainerdConfig = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{sandbox}}"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        NoPivotRoot = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
`

// guestKubeletConfig is the guest kubelet's KubeletConfiguration: cgroup v2 with cgroupfs, the
// API server's kubelet client CA for its own API, relaxed eviction and no image GC (everything
// lives in memory).
func guestKubeletConfig() map[string]any {
	return map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
		"address": GuestIP, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
		"cgroupDriver": "cgroupfs", "failSwapOn": false,
		"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
		"makeIPTablesUtilChains":   false, "resolvConf": "", "serializeImagePulls": false,
		"evictionHard":                map[string]string{"memory.available": "50Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
		"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
		"enforceNodeAllocatable": []string{},
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": "/etc/kubernetes/client-ca.crt"},
		},
		"authorization": map[string]any{"mode": "Webhook"},
	}
}

// consoleTailLines is how much of the guest's console a failed boot quotes: enough for a kernel
// oops or a soft lockup's call trace, which is what CI's report shows when the log directory is
// gone.
const consoleTailLines = 30

// fileTail returns the last n lines of the file's last 64 KiB (or why it cannot be read).
func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	const window = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		if _, err := f.Seek(st.Size()-window, io.SeekStart); err != nil {
			return err.Error()
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
