package e2e

import (
	"archive/tar"
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The Debian kernel flavours of the guest node: the node boots the first and is upgraded to the
// second (they report different kernel strings: 6.1.0-N-cloud-amd64, 6.1.0-N-amd64).
const (
	FlavourCloud   = "cloud-amd64"
	FlavourGeneric = "amd64"
)

// guestKernelModules are the modules of the kernel package the guest needs, with their
// dependencies (depmod's closure, the same in both flavours), relative to lib/modules/<release>:
// the virtio network card, the CNI bridge and veth, and dummy, the in-tree module the guest loads
// at boot and a Module removes (inTreeModulesToRemove).
var guestKernelModules = []string{
	"kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko",
	"kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/virtio/virtio_pci_legacy_dev.ko", "kernel/drivers/virtio/virtio_pci_modern_dev.ko",
	"kernel/drivers/virtio/virtio_pci.ko", "kernel/drivers/net/virtio_net.ko",
	"kernel/net/llc/llc.ko", "kernel/net/802/stp.ko", "kernel/net/bridge/bridge.ko", "kernel/net/bridge/br_netfilter.ko",
	"kernel/drivers/net/veth.ko", "kernel/drivers/net/dummy.ko",
}

// guestBootModules are loaded at boot, in this order (modprobe resolves the rest).
var guestBootModules = []string{"virtio_pci", "virtio_net", "bridge", "br_netfilter", "veth", InTreeModule}

// InTreeModule is the in-tree module the guest loads at boot, for inTreeModulesToRemove.
const InTreeModule = "dummy"

// kernelIndexes are depmod's inputs from the kernel package.
var kernelIndexes = []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"}

// DebianKernel is a Debian kernel package, its headers extracted for module builds.
type DebianKernel struct {
	// Flavour is FlavourCloud or FlavourGeneric; Package the versioned image package.
	Flavour, Package string
	// Release is the kernel's uname -r.
	Release string
	// Vmlinuz is the kernel image; Modules is lib/modules/<Release> with guestKernelModules and
	// kernelIndexes only; Headers is the kbuild directory (linux-headers-<Release>).
	Vmlinuz, Modules, Headers string
}

// FetchKernel downloads (apt-get download) and extracts the current Debian kernel of the flavour
// and its headers into cache, unless an earlier run did. The versioned package is resolved from
// the metapackage linux-image-<flavour> on every run (each security update changes it).
func FetchKernel(cache, flavour string) (*DebianKernel, error) {
	pkg, err := aptDependency("linux-image-"+flavour, "linux-image-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, pkg)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		if err := fetchKernelInto(dir, pkg); err != nil {
			return nil, err
		}
	}
	release := strings.TrimPrefix(pkg, "linux-image-")
	if err := relocateHeaders(filepath.Join(dir, "usr", "src", "linux-headers-"+release)); err != nil {
		return nil, err
	}
	k := &DebianKernel{Flavour: flavour, Package: pkg, Release: release,
		Vmlinuz: filepath.Join(dir, "boot", "vmlinuz-"+release),
		Modules: filepath.Join(dir, "lib", "modules", release),
		Headers: filepath.Join(dir, "usr", "src", "linux-headers-"+release)}
	for _, p := range []string{k.Vmlinuz, k.Modules, k.Headers} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("kernel %s: %w (remove %s to fetch it again)", pkg, err, dir)
		}
	}
	return k, nil
}

// fetchKernelInto downloads the image package, the headers of the same release, their common
// headers and kbuild, and extracts them into dir.
func fetchKernelInto(dir, pkg string) error {
	release := strings.TrimPrefix(pkg, "linux-image-")
	headers := "linux-headers-" + release
	common, err := aptDependency(headers, "linux-headers-")
	if err != nil {
		return err
	}
	kbuild, err := aptDependency(headers, "linux-kbuild-")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".fetch-")
	if err != nil && os.MkdirAll(filepath.Dir(dir), 0o750) == nil {
		tmp, err = os.MkdirTemp(filepath.Dir(dir), ".fetch-")
	}
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	debs, err := aptDownload(tmp, pkg, headers, common, kbuild)
	if err != nil {
		return err
	}
	root := filepath.Join(tmp, "root")
	if err := extractDeb(debs[0], root, func(name string) bool { return wantedKernelFile(name, release) }); err != nil {
		return err
	}
	for _, deb := range debs[1:] {
		if err := extractDeb(deb, root, func(string) bool { return true }); err != nil {
			return err
		}
	}
	if err := relocateHeaders(filepath.Join(root, "usr", "src", headers)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, ".complete"), nil, 0o600); err != nil {
		return err
	}
	_ = os.RemoveAll(dir)
	return os.Rename(root, dir)
}

// wantedKernelFile selects the kernel image and, below lib/modules/<release>, guestKernelModules
// and kernelIndexes.
func wantedKernelFile(name, release string) bool {
	if name == "/boot/vmlinuz-"+release {
		return true
	}
	rel, ok := strings.CutPrefix(name, "/lib/modules/"+release+"/")
	if !ok {
		return false
	}
	for _, w := range append(append([]string{}, guestKernelModules...), kernelIndexes...) {
		if rel == w {
			return true
		}
	}
	return false
}

// aptDependency is the first dependency of pkg starting with prefix (apt-cache depends), after an
// apt-get update when apt does not know pkg yet.
func aptDependency(pkg, prefix string) (string, error) {
	dep := func() (string, error) {
		out, err := exec.Command("apt-cache", "depends", pkg).CombinedOutput() //nolint:gosec // G204: package names we build
		if err != nil {
			return "", fmt.Errorf("apt-cache depends %s: %w: %s", pkg, err, out)
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], prefix) {
				return f[1], nil
			}
		}
		return "", fmt.Errorf("apt-cache depends %s names no %s* package: %s", pkg, prefix, out)
	}
	d, err := dep()
	if err != nil {
		if out, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("%w; apt-get update: %v: %s", err, uerr, out)
		}
		d, err = dep()
	}
	return d, err
}

// aptDownload downloads the packages' .deb files into dir, in the order given.
func aptDownload(dir string, pkgs ...string) ([]string, error) {
	cmd := exec.Command("apt-get", append([]string{"download", "-qq"}, pkgs...)...) //nolint:gosec // G204: package names we build
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get download %v: %w: %s", pkgs, err, out)
	}
	debs := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		m, _ := filepath.Glob(filepath.Join(dir, p+"_*.deb"))
		if len(m) != 1 {
			return nil, fmt.Errorf("apt-get download %s left %v", p, m)
		}
		debs = append(debs, m[0])
	}
	return debs, nil
}

// extractDeb writes the files, symbolic links and directories of the package's file tree that
// want selects below root (dpkg-deb --fsys-tarfile: nothing is installed, no script runs).
func extractDeb(deb, root string, want func(name string) bool) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb) //nolint:gosec // G204: a file we downloaded
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	xerr := extractTar(tar.NewReader(stdout), root, want)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	return xerr
}

func extractTar(tr *tar.Reader, root string, want func(string) bool) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + hdr.Name)
		if !want(name) {
			continue
		}
		dest := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dest), 0o750); err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dest, 0o750)
		case tar.TypeSymlink:
			_ = os.Remove(dest)
			err = os.Symlink(hdr.Linkname, dest)
		case tar.TypeReg:
			mode := os.FileMode(0o644)
			if hdr.Mode&0o111 != 0 {
				mode = 0o755
			}
			err = writeFrom(dest, tr, mode)
		}
		if err != nil {
			return err
		}
	}
}

func writeFrom(dest string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode|0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r) // #nosec G110 -- a Debian package from the configured mirror
	return errors.Join(err, f.Close())
}

//go:embed kmod/kmm_e2e.c
var kmodSource []byte

// KmodSpec is one build of test/e2e/kmod/kmm_e2e.c.
type KmodSpec struct {
	// Name is the module's name; Version its MODULE_VERSION.
	Name, Version string
	// Firmware, when set, is the firmware file the module requests at init (its init fails
	// without it).
	Firmware string
}

// BuildKmod compiles the module for the kernel with its Debian headers (kbuild, the host's gcc)
// and returns the .ko file's content.
func BuildKmod(k *DebianKernel, s KmodSpec) ([]byte, error) {
	dir, err := os.MkdirTemp("", "kmm-kmod-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	flags := fmt.Sprintf(`-DKMM_NAME='"%s"' -DKMM_VERSION='"%s"'`, s.Name, s.Version)
	if s.Firmware != "" {
		flags += fmt.Sprintf(` -DKMM_FIRMWARE='"%s"'`, s.Firmware)
	}
	files := map[string][]byte{
		s.Name + ".c": kmodSource,
		"Kbuild":      fmt.Appendf(nil, "obj-m := %s.o\nccflags-y := %s\n", s.Name, flags),
	}
	for f, data := range files {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("make", "-s", "-C", k.Headers, "M="+dir, "modules") //nolint:gosec // G204: our own build
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building %s for %s: %w: %s", s.Name, k.Release, err, out)
	}
	return os.ReadFile(filepath.Join(dir, s.Name+".ko"))
}

// KmodImage is a FROM-scratch kmod image for the kernel release: the modules under
// /opt/lib/modules/<release>/extra with depmod's output, the firmware files under /firmware.
func KmodImage(release string, modules, firmware map[string][]byte) (v1.Image, error) {
	root, err := os.MkdirTemp("", "kmm-kmod-image-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(root) }()
	files := map[string][]byte{}
	for name, data := range modules {
		files[path.Join("opt/lib/modules", release, "extra", name+".ko")] = data
	}
	for name, data := range firmware {
		files[path.Join("firmware", name)] = data
	}
	for f, data := range files {
		p := filepath.Join(root, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return nil, err
		}
	}
	if out, err := exec.Command(depmod(), "-b", filepath.Join(root, "opt"), release).CombinedOutput(); err != nil { //nolint:gosec // G204: our own depmod run
		return nil, fmt.Errorf("depmod: %w: %s", err, out)
	}
	data, err := tarDir(root)
	if err != nil {
		return nil, err
	}
	return layerImage(data, nil)
}

// depmod is the host's depmod (Debian's kmod).
func depmod() string {
	for _, p := range []string{"/usr/sbin/depmod", "/sbin/depmod"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "depmod"
}

// tarDir archives the tree below root (directories and regular files), sorted, owner root.
func tarDir(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if info.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		}
		data, err := os.ReadFile(p) //nolint:gosec // G304: the tree we built
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	return buf.Bytes(), tw.Close()
}

// KmodSourceText is test/e2e/kmod/kmm_e2e.c, for a Dockerfile that carries it inline.
func KmodSourceText() string { return string(kmodSource) }

// absoluteInclude is the headers' include of the common headers by absolute path: Debian's
// /usr/src/..., or the cache folder an earlier version of this code wrote in (a cache built
// through another checkout's path then pointed there).
var absoluteInclude = regexp.MustCompile(`(?m)^include \S*/usr/src/`)

// relocateHeaders has the Makefile in headers include the common headers beside it, wherever the
// cache folder is: relative to the Makefile's own folder, which make knows as the directory of
// the last file of MAKEFILE_LIST. It is idempotent.
func relocateHeaders(headers string) error {
	mk := filepath.Join(headers, "Makefile")
	data, err := os.ReadFile(mk)
	if err != nil {
		return err
	}
	fixed := absoluteInclude.ReplaceAll(data, []byte("include $(dir $(lastword $(MAKEFILE_LIST)))../"))
	if bytes.Equal(fixed, data) {
		return nil
	}
	return os.WriteFile(mk, fixed, 0o600)
}
