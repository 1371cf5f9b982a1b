package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// buildBaseRoots are the Debian packages of the in-cluster build's base image: a C toolchain for
// kbuild (gcc, make, the C library's headers), the shell and tools kbuild's Makefiles and scripts
// run (dash as /bin/sh, bash, coreutils, sed, grep, mawk as awk, findutils), libelf for objtool, and
// kmod (depmod). apt-cache adds their dependencies.
var buildBaseRoots = []string{"gcc", "make", "libc6-dev", "dash", "bash", "coreutils", "sed", "grep",
	"mawk", "findutils", "kmod", "libelf1"}

// buildBaseSkip are dependencies apt-cache names that the image does without: the other awks (mawk
// is linked as awk) and dpkg's and install-info's maintainer tooling (no script runs).
var buildBaseSkip = map[string]bool{"gawk": true, "original-awk": true, "libsigsegv2": true}

// mergedUsr maps Debian 12's /bin, /sbin, /lib and /lib64 into /usr, where the image's links send them.
var mergedUsrDirs = []string{"bin", "sbin", "lib", "lib64"}

// BaseEntry is one file, link or directory of an image tree.
type baseEntry struct {
	typ  byte
	mode int64
	data []byte
	link string
}

// BuildBaseImage assembles, from Debian packages and without a container engine, the base image an
// in-cluster build of a kmod for k starts FROM: the toolchain above and k's headers
// (/usr/src/linux-headers-<release>, its -common tree and linux-kbuild, as the packages install
// them), with /bin/sh, awk and the merged-/usr links a Debian system has. Packages are downloaded
// into debDir once (apt-get download, checked by name and version).
func BuildBaseImage(debDir string, k *DebianKernel) (v1.Image, error) {
	pkgs, err := aptClosure(buildBaseRoots)
	if err != nil {
		return nil, err
	}
	debs, err := aptDownloadCached(debDir, pkgs)
	if err != nil {
		return nil, err
	}
	t := map[string]*baseEntry{}
	for _, deb := range debs {
		if err := readDebInto(t, deb); err != nil {
			return nil, err
		}
	}
	if err := addKernelTree(t, filepath.Dir(filepath.Dir(filepath.Dir(k.Headers)))); err != nil {
		return nil, err
	}
	for _, d := range mergedUsrDirs {
		t[d] = &baseEntry{typ: tar.TypeSymlink, link: "usr/" + d}
	}
	t["usr/bin/awk"] = &baseEntry{typ: tar.TypeSymlink, link: "mawk"}
	t["usr/bin/sh"] = &baseEntry{typ: tar.TypeSymlink, link: "dash"}
	t["tmp"] = &baseEntry{typ: tar.TypeDir, mode: 0o1777}
	return baseImage(t)
}

// aptClosure is roots with their dependencies (apt-cache depends --recurse, no recommends),
// without virtual packages and buildBaseSkip.
func aptClosure(roots []string) ([]string, error) {
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances"}, roots...)
	out, err := exec.Command("apt-cache", args...).Output() //nolint:gosec // G204: package names we list
	if err != nil {
		return nil, fmt.Errorf("apt-cache depends: %w", err)
	}
	seen := map[string]bool{}
	for line := range strings.SplitSeq(string(out), "\n") {
		if line == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "<") || buildBaseSkip[line] {
			continue
		}
		seen[line] = true
	}
	pkgs := make([]string, 0, len(seen))
	for p := range seen {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	return pkgs, nil
}

// aptDownloadCached returns the .deb files of pkgs' candidate versions in dir, downloading those
// not there yet.
func aptDownloadCached(dir string, pkgs []string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	out, err := exec.Command("apt-get", append([]string{"download", "--print-uris", "-qq"}, pkgs...)...).Output() //nolint:gosec // G204: package names we list
	if err != nil {
		return nil, fmt.Errorf("apt-get download --print-uris: %w", err)
	}
	var files, missing []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasSuffix(f[1], ".deb") {
			return nil, fmt.Errorf("unexpected apt-get --print-uris line %q", line)
		}
		files = append(files, filepath.Join(dir, f[1]))
		if _, err := os.Stat(filepath.Join(dir, f[1])); err != nil {
			pkg, _, _ := strings.Cut(f[1], "_")
			missing = append(missing, pkg)
		}
	}
	if len(missing) > 0 {
		cmd := exec.Command("apt-get", append([]string{"download", "-qq"}, missing...)...) //nolint:gosec // G204: package names we list
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("apt-get download: %w: %s", err, out)
		}
	}
	if len(files) != len(pkgs) {
		return nil, fmt.Errorf("apt-get named %d files for %d packages", len(files), len(pkgs))
	}
	return files, nil
}

// readDebInto adds a package's file tree (dpkg-deb --fsys-tarfile) to t, merged into /usr, without
// documentation.
func readDebInto(t map[string]*baseEntry, deb string) error {
	data, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output() //nolint:gosec // G204: a file we downloaded
	if err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", deb, err)
		}
		name := mergeUsr(strings.TrimPrefix(path.Clean("/"+hdr.Name), "/"))
		if name == "" || skipBaseFile(name) {
			continue
		}
		if err := putEntry(t, name, hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", deb, err)
		}
	}
}

func putEntry(t map[string]*baseEntry, name string, hdr *tar.Header, r io.Reader) error {
	switch hdr.Typeflag {
	case tar.TypeDir:
		if _, ok := t[name]; !ok {
			t[name] = &baseEntry{typ: tar.TypeDir, mode: 0o755}
		}
	case tar.TypeSymlink:
		t[name] = &baseEntry{typ: tar.TypeSymlink, link: hdr.Linkname}
	case tar.TypeLink:
		target := t[mergeUsr(strings.TrimPrefix(path.Clean("/"+hdr.Linkname), "/"))]
		if target == nil {
			return fmt.Errorf("hard link %s to missing %s", name, hdr.Linkname)
		}
		t[name] = target
	case tar.TypeReg:
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		t[name] = &baseEntry{typ: tar.TypeReg, mode: hdr.Mode & 0o755, data: data}
	}
	return nil
}

// mergeUsr maps bin/x to usr/bin/x (and sbin, lib, lib64), as Debian 12 installs them.
func mergeUsr(name string) string {
	for _, d := range mergedUsrDirs {
		if name == d {
			return "usr/" + d
		}
		if rest, ok := strings.CutPrefix(name, d+"/"); ok {
			return "usr/" + d + "/" + rest
		}
	}
	return name
}

func skipBaseFile(name string) bool {
	for _, p := range []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/lintian/"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// addKernelTree adds the kernel cache's usr/src and usr/lib (the headers, the common headers, kbuild)
// under /usr, with the headers' Makefile pointing at /usr/src again (FetchKernel points it into
// the cache).
func addKernelTree(t map[string]*baseEntry, cacheRoot string) error {
	for _, sub := range []string{"usr/src", "usr/lib"} {
		err := filepath.Walk(filepath.Join(cacheRoot, sub), func(p string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(cacheRoot, p)
			if err != nil {
				return err
			}
			return addKernelFile(t, cacheRoot, filepath.ToSlash(rel), p, info)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func addKernelFile(t map[string]*baseEntry, cacheRoot, name, p string, info os.FileInfo) error {
	switch {
	case info.IsDir():
		t[name] = &baseEntry{typ: tar.TypeDir, mode: 0o755}
	case info.Mode()&os.ModeSymlink != 0:
		link, err := os.Readlink(p)
		if err != nil {
			return err
		}
		t[name] = &baseEntry{typ: tar.TypeSymlink, link: link}
	case info.Mode().IsRegular():
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if path.Base(name) == "Makefile" && strings.HasPrefix(name, "usr/src/linux-headers-") && strings.Count(name, "/") == 3 {
			data = headersInclude.ReplaceAll(data, []byte("include /usr/src/"))
		}
		t[name] = &baseEntry{typ: tar.TypeReg, mode: int64(info.Mode().Perm() & 0o755), data: data}
	}
	return nil
}

// headersInclude is the headers Makefile's include of the common headers, which FetchKernel points
// into the cache (of whichever checkout fetched it first).
var headersInclude = regexp.MustCompile(`include \S*/usr/src/`)

// baseImage is one gzip layer (fastest level: the image only travels to the local registry) of t,
// sorted, owner root, for this machine's platform.
func baseImage(t map[string]*baseEntry) (v1.Image, error) {
	names := make([]string, 0, len(t))
	for n := range t {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := writeBaseEntry(tw, n, t[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layerImage(buf.Bytes(), func(c *v1.Config) {
		c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
}

func writeBaseEntry(tw *tar.Writer, name string, e *baseEntry) error {
	hdr := &tar.Header{Name: name, Typeflag: e.typ, Mode: e.mode}
	switch e.typ {
	case tar.TypeDir:
		hdr.Name += "/"
	case tar.TypeSymlink:
		hdr.Linkname, hdr.Mode = e.link, 0o777
	case tar.TypeReg:
		hdr.Size = int64(len(e.data))
		if hdr.Mode&0o111 != 0 {
			hdr.Mode = 0o755
		} else {
			hdr.Mode = 0o644
		}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if e.typ == tar.TypeReg {
		_, err := tw.Write(e.data)
		return err
	}
	return nil
}
