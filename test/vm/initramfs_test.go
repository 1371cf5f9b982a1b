//go:build vm

package vm

import (
	"bufio"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

// buildStatic builds the main packages of the repository at repo statically (CGO_ENABLED=0), in
// one go build so that they share the work, and moves each binary to its destination.
func buildStatic(t *testing.T, repo string, dest map[string]string) {
	t.Helper()
	out := t.TempDir()
	pkgs := sortedKeys(dest)
	args := append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", out + "/"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v: %s", pkgs, err, msg)
	}
	for _, pkg := range pkgs {
		if err := os.MkdirAll(filepath.Dir(dest[pkg]), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(out, filepath.Base(pkg)), dest[pkg]); err != nil {
			t.Fatal(err)
		}
	}
}

// stageKmod copies the host's modprobe (Debian's kmod, dynamically linked) into root as
// /bin/kmod with /sbin/modprobe linking to it, and the shared libraries and dynamic loader it
// needs at the paths ldd names.
func stageKmod(t *testing.T, root string) {
	t.Helper()
	modprobe, err := exec.LookPath("modprobe")
	if err != nil {
		for _, p := range []string{"/usr/sbin/modprobe", "/sbin/modprobe"} {
			if _, serr := os.Stat(p); serr == nil {
				modprobe, err = p, nil
			}
		}
	}
	if err != nil {
		t.Fatal("modprobe is missing: install the Debian package kmod (make test-vm does)")
	}
	kmod, err := filepath.EvalSymlinks(modprobe)
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, kmod, filepath.Join(root, "bin/kmod"))
	if err := os.MkdirAll(filepath.Join(root, "sbin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../bin/kmod", filepath.Join(root, Modprobe)); err != nil {
		t.Fatal(err)
	}
	for _, lib := range sharedLibraries(t, kmod) {
		copyFile(t, lib, filepath.Join(root, lib))
	}
}

// lddPath matches the absolute paths in ldd's output.
var lddPath = regexp.MustCompile(`(^|\s)(/\S+)`)

// sharedLibraries returns the shared libraries and the dynamic loader of the binary, from ldd.
func sharedLibraries(t *testing.T, binary string) []string {
	t.Helper()
	out, err := exec.Command("ldd", binary).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd %s: %v: %s", binary, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := lddPath.FindStringSubmatch(sc.Text()); m != nil {
			libs = append(libs, m[2])
		}
	}
	if len(libs) == 0 {
		t.Fatalf("ldd %s named no library: %s", binary, out)
	}
	return libs
}

// copyFile copies src (following links) to dst, keeping its permission bits.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	st, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(src) // #nosec G304 -- host tools found by the test
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, data, st.Mode().Perm())
}

// stageRoot lays out the guest's root file system in root: the init and the worker, kmod, the
// guest's own module tree (for in-tree removal), the plan and the OCI layout of the kmod images.
func stageRoot(t *testing.T, repo, root string, k kernel, layoutDir string) {
	t.Helper()
	buildStatic(t, repo, map[string]string{
		"./test/vm/guestinit": filepath.Join(root, "init"),
		"./cmd/worker":        filepath.Join(root, WorkerBinary),
	})
	stageKmod(t, root)
	moduleTree(t, k, root, realModules(t, k, "kernel/drivers/net/dummy.ko"))
	plan, err := json.Marshal(Plan{Kernel: k.Version})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, PlanFile), plan, 0o644)
	for _, d := range []string{"proc", "sys", "dev", "tmp", "var/lib", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(layoutDir, filepath.Join(root, LayoutDir)); err != nil {
		t.Fatal(err)
	}
}

// writeInitramfs writes the tree root as an uncompressed newc cpio archive (what the kernel
// unpacks as its initramfs) to file, reproducibly: owner root, no timestamps, sorted.
func writeInitramfs(t *testing.T, root, file string) {
	t.Helper()
	recs := []cpio.Record{cpio.Directory("dev", 0o755), cpio.CharDev("dev/console", 0o600, 5, 1)}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "dev" {
			return err
		}
		rec, err := record(p, filepath.ToSlash(rel), d)
		recs = append(recs, rec)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck // closed below; this is for the error paths
	bw := bufio.NewWriterSize(f, 1<<20)
	w := cpio.Newc.Writer(bw)
	cpio.MakeAllReproducible(recs)
	if err := cpio.WriteRecords(w, recs); err != nil {
		t.Fatal(err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// record returns the cpio record of the file p, named name in the archive.
func record(p, name string, d fs.DirEntry) (cpio.Record, error) {
	info, err := d.Info()
	if err != nil {
		return cpio.Record{}, err
	}
	perm := uint64(info.Mode().Perm())
	switch {
	case d.IsDir():
		return cpio.Directory(name, perm), nil
	case d.Type()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		return cpio.Symlink(name, target), err
	default:
		data, err := os.ReadFile(p) // #nosec G304 -- the staged tree
		return cpio.StaticRecord(data, cpio.Info{Name: name, Mode: cpio.S_IFREG | perm}), err
	}
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
