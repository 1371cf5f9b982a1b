//go:build vm

package vm

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// kernelMetaPackage is the Debian metapackage whose dependency is the current cloud kernel. The
// versioned package changes with every security update, so it is resolved on each run.
const kernelMetaPackage = "linux-image-cloud-amd64"

// kernelModules are the modules the test uses, relative to lib/modules/<kernel>.
var kernelModules = []string{
	"kernel/drivers/net/dummy.ko",
	"kernel/drivers/net/macvlan.ko",
	"kernel/drivers/net/tap.ko",
	"kernel/drivers/net/macvtap.ko",
}

// kernelIndexes are depmod's inputs from the kernel package; they let modprobe tell built-in
// modules apart.
var kernelIndexes = []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"}

// kernel is a Debian kernel extracted into the cache.
type kernel struct {
	// Package is the Debian package, e.g. linux-image-6.1.0-56-cloud-amd64.
	Package string
	// Version is the kernel release (uname -r).
	Version string
	// Vmlinuz is the kernel image.
	Vmlinuz string
	// ModulesDir is lib/modules/<Version> with kernelModules and kernelIndexes only.
	ModulesDir string
}

// fetchKernel returns the current Debian cloud kernel, downloading it with apt-get and extracting
// the few files the test needs into cache/kernel/<package> unless a previous run did.
func fetchKernel(t *testing.T, cache string) kernel {
	t.Helper()
	pkg := resolveKernelPackage(t)
	dir := filepath.Join(cache, "kernel", pkg)
	if _, err := os.Stat(dir); err != nil {
		t.Logf("downloading %s (first run with this kernel)", pkg)
		tmp, err := os.MkdirTemp(cache, ".kernel-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(tmp) //nolint:errcheck // best effort
		deb := downloadPackage(t, tmp, pkg)
		root := filepath.Join(tmp, "root")
		if err := extractKernel(deb, root); err != nil {
			t.Fatalf("extracting %s: %v", deb, err)
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(root, dir); err != nil {
			t.Fatal(err)
		}
	}
	pruneOtherKernels(t, filepath.Dir(dir), pkg)
	return loadKernel(t, pkg, dir)
}

// pruneOtherKernels removes the kernels of earlier runs that the metapackage no longer names, so
// that security updates do not pile up in the cache.
func pruneOtherKernels(t *testing.T, dir, keep string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != keep {
			t.Logf("removing %s from the cache: %s replaces it", e.Name(), keep)
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				t.Error(err)
			}
		}
	}
}

// loadKernel describes the extracted kernel in dir.
func loadKernel(t *testing.T, pkg, dir string) kernel {
	t.Helper()
	versions, err := os.ReadDir(filepath.Join(dir, "lib/modules"))
	if err != nil || len(versions) != 1 {
		t.Fatalf("%s: want exactly one lib/modules/<kernel> directory (%v); remove the directory to download again", dir, err)
	}
	k := kernel{Package: pkg, Version: versions[0].Name()}
	k.Vmlinuz = filepath.Join(dir, "boot", "vmlinuz-"+k.Version)
	k.ModulesDir = filepath.Join(dir, "lib/modules", k.Version)
	for _, f := range append(append([]string{}, kernelModules...), kernelIndexes...) {
		if _, err := os.Stat(filepath.Join(k.ModulesDir, f)); err != nil {
			t.Fatalf("the kernel package %s has no %s: %v", pkg, f, err)
		}
	}
	if _, err := os.Stat(k.Vmlinuz); err != nil {
		t.Fatal(err)
	}
	return k
}

// resolveKernelPackage asks apt which versioned package the metapackage depends on, updating the
// package lists first when apt knows nothing yet (a fresh machine).
func resolveKernelPackage(t *testing.T) string {
	t.Helper()
	pkg, err := kernelDependency()
	if err != nil {
		aptUpdate(t)
		pkg, err = kernelDependency()
	}
	if err != nil {
		t.Fatalf("resolving the kernel package: %v", err)
	}
	return pkg
}

// kernelDependency parses `apt-cache depends` of the metapackage.
func kernelDependency() (string, error) {
	out, err := exec.Command("apt-cache", "depends", kernelMetaPackage).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w: %s", kernelMetaPackage, err, out)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("apt-cache depends %s names no linux-image package: %s", kernelMetaPackage, out)
}

// aptUpdate refreshes apt's package lists (needs root, as on CI machines).
func aptUpdate(t *testing.T) {
	t.Helper()
	t.Log("running apt-get update")
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		t.Fatalf("apt-get update (run the test as root or run it yourself first): %v: %s", err, out)
	}
}

// downloadPackage downloads pkg's .deb into dir with apt-get, refreshing stale package lists once.
func downloadPackage(t *testing.T, dir, pkg string) string {
	t.Helper()
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "download", "-qq", pkg)
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil {
		aptUpdate(t)
		out, err = download()
	}
	if err != nil {
		t.Fatalf("apt-get download %s: %v: %s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("apt-get download %s left %v in %s", pkg, debs, dir)
	}
	return debs[0]
}

// extractKernel writes the kernel image and the files the test needs of the package deb to root,
// reading the package's file tree from dpkg-deb (nothing is installed).
func extractKernel(deb, root string) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	extractErr := extractWanted(tar.NewReader(stdout), root)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("dpkg-deb: %w: %s", err, stderr.String())
	}
	return extractErr
}

// extractWanted writes the regular files of tr that wantedKernelFile selects below root.
func extractWanted(tr *tar.Reader, root string) error {
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + hdr.Name)
		if hdr.Typeflag != tar.TypeReg || !wantedKernelFile(name) {
			continue
		}
		dest := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(dest, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr) // #nosec G110 -- a Debian package from the configured mirror
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// wantedKernelFile selects /boot/vmlinuz-*, /boot/config-* and, below /lib/modules/<kernel>/,
// kernelModules and kernelIndexes.
func wantedKernelFile(name string) bool {
	if strings.HasPrefix(name, "/boot/vmlinuz-") || strings.HasPrefix(name, "/boot/config-") {
		return true
	}
	rest, ok := strings.CutPrefix(name, "/lib/modules/")
	if !ok {
		return false
	}
	_, rel, ok := strings.Cut(rest, "/")
	if !ok {
		return false
	}
	for _, want := range append(append([]string{}, kernelModules...), kernelIndexes...) {
		if rel == want {
			return true
		}
	}
	return false
}
