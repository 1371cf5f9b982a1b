// Package kmodimage builds kmod images for tests and the demo: FROM scratch images holding
// <dirName>/lib/modules/<kernel>/ with real ELF .ko files compiled by gcc and the output of Debian's
// depmod, so that a real `modprobe -n -d <root> -S <kernel>` resolves the module and its dependency.
package kmodimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Spec describes one image: a module that depends on a helper module (through a symbol depmod
// sees), built for Kernel, under DirName ("opt" by default), with Version written into the modules.
type Spec struct {
	Kernel  string
	Module  string
	Version string
	DirName string
}

// Tools are the paths of gcc and depmod.
type Tools struct {
	GCC    string
	Depmod string
}

// FindTools looks gcc and depmod up, naming the Debian package to install when one is missing.
func FindTools() (Tools, error) {
	gcc, err := find("gcc", "gcc")
	if err != nil {
		return Tools{}, err
	}
	depmod, err := find("depmod", "kmod")
	return Tools{GCC: gcc, Depmod: depmod}, err
}

func find(tool, pkg string) (string, error) {
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(dir, tool); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(tool); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s is missing: install the Debian package %s", tool, pkg)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode()&0o111 != 0
}

// Build compiles the modules of s, runs depmod and returns the image.
func Build(tools Tools, s Spec) (v1.Image, error) {
	if s.DirName == "" {
		s.DirName = "opt"
	}
	root, err := os.MkdirTemp("", "kmod-image-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(root) }()
	if err := buildTree(tools, root, s); err != nil {
		return nil, err
	}
	data, err := tarTree(filepath.Join(root, "lib"), path.Join(s.DirName, "lib"))
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(empty.Image, layer)
}

// buildTree writes lib/modules/<kernel>/extra/{<module>,<module>_dep}.ko under root and runs depmod.
func buildTree(tools Tools, root string, s Spec) error {
	extra := filepath.Join(root, "lib", "modules", s.Kernel, "extra")
	if err := os.MkdirAll(extra, 0o750); err != nil {
		return err
	}
	dep := s.Module + "_dep"
	sources := map[string]string{
		dep: fmt.Sprintf("int %[1]s_fn(void) { return 1; }\n"+
			"static const char kstr[] __attribute__((section(\"__ksymtab_strings\"), used, aligned(1))) = \"%[1]s_fn\";\n", dep) +
			modinfo(dep, s),
		s.Module: fmt.Sprintf("extern int %[1]s_fn(void);\nint %[2]s_fn(void) { return %[1]s_fn() + 1; }\n", dep, s.Module) +
			modinfo(s.Module, s),
	}
	for mod, src := range sources {
		c := filepath.Join(root, mod+".c")
		if err := os.WriteFile(c, []byte(src), 0o600); err != nil {
			return err
		}
		if out, err := exec.Command(tools.GCC, "-c", "-O0", "-o", filepath.Join(extra, mod+".ko"), c).CombinedOutput(); err != nil { //nolint:gosec // G204: our own compiler invocation
			return fmt.Errorf("gcc: %w: %s", err, out)
		}
		if err := os.Remove(c); err != nil {
			return err
		}
	}
	if out, err := exec.Command(tools.Depmod, "-b", root, s.Kernel).CombinedOutput(); err != nil { //nolint:gosec // G204: our own depmod invocation
		return fmt.Errorf("depmod: %w: %s", err, out)
	}
	return nil
}

// modinfo is the .modinfo section of a module: name, vermagic, license, and the version.
func modinfo(mod string, s Spec) string {
	var b strings.Builder
	for i, kv := range []string{"name=" + mod, "vermagic=" + s.Kernel + " SMP mod_unload ", "license=GPL", "version=" + s.Version, "depends="} {
		fmt.Fprintf(&b, "static const char mi%d[] __attribute__((section(\".modinfo\"), used, aligned(1))) = \"%s\";\n", i, kv)
	}
	return b.String()
}

// tarTree archives the directory src under the archive directory prefix.
func tarTree(src, prefix string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := path.Join(prefix, filepath.ToSlash(rel))
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		}
		data, err := os.ReadFile(p) //nolint:gosec // G304: a file of the tree we just built
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
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
