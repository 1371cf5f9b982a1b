//go:build vm

package vm

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// moduleTree writes lib/modules/<kernel> below base with the given modules (path relative to
// lib/modules/<kernel> → content), the kernel's indexes and depmod's output for them.
func moduleTree(t *testing.T, k kernel, base string, modules map[string][]byte) {
	t.Helper()
	dir := filepath.Join(base, "lib/modules", k.Version)
	for _, f := range kernelIndexes {
		data, err := os.ReadFile(filepath.Join(k.ModulesDir, f))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, f), data, 0o644)
	}
	for rel, data := range modules {
		writeFile(t, filepath.Join(dir, rel), data, 0o644)
	}
	// The kernel package ships no modules.dep (its postinst makes it): run depmod on the tree.
	if out, err := exec.Command(depmodPath(t), "-b", base, k.Version).CombinedOutput(); err != nil {
		t.Fatalf("depmod -b %s %s: %v: %s", base, k.Version, err, out)
	}
}

// depmodPath returns the host's depmod, failing with the package to install when it is missing.
func depmodPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/sbin/depmod", "/sbin/depmod"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("depmod"); err == nil {
		return p
	}
	t.Fatal("depmod is missing: install the Debian package kmod (make test-vm does)")
	return ""
}

// realModules returns the kernel's modules the test uses, by path below lib/modules/<kernel>.
func realModules(t *testing.T, k kernel, rels ...string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, rel := range rels {
		data, err := os.ReadFile(filepath.Join(k.ModulesDir, rel))
		if err != nil {
			t.Fatal(err)
		}
		out[rel] = data
	}
	return out
}

// moduleSignatureMagic ends a module with an appended signature.
const moduleSignatureMagic = "~Module signature appended~\n"

// wrongKernelModule turns a module of this kernel into one that looks built for another kernel
// build: it drops the appended signature (a bad signature would be refused first, even without
// enforcement) and flips the CRC of module_layout in __versions, as a different build has it.
func wrongKernelModule(ko []byte) ([]byte, error) {
	ko = bytes.Clone(ko)
	if bytes.HasSuffix(ko, []byte(moduleSignatureMagic)) {
		// struct module_signature (12 bytes, big-endian sig_len last) precedes the magic.
		body := ko[:len(ko)-len(moduleSignatureMagic)]
		if len(body) < 12 {
			return nil, errors.New("truncated module signature")
		}
		sigLen := int(binary.BigEndian.Uint32(body[len(body)-4:]))
		if sigLen+12 > len(body) {
			return nil, errors.New("module signature longer than the module")
		}
		ko = body[:len(body)-12-sigLen]
	}
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section("__versions")
	if sec == nil {
		return nil, errors.New("the module has no __versions section (CONFIG_MODVERSIONS)")
	}
	// Each entry is {unsigned long crc; char name[64 - sizeof(unsigned long)]}.
	const entry = 64
	for off := sec.Offset; off+entry <= sec.Offset+sec.Size; off += entry {
		name, _, _ := bytes.Cut(ko[off+8:off+entry], []byte{0})
		if string(name) == "module_layout" {
			for i := range uint64(8) {
				ko[off+i] ^= 0xff
			}
			return ko, nil
		}
	}
	return nil, errors.New("no module_layout entry in __versions")
}

// imageFromDir builds a kmod image FROM scratch whose one layer is the content of dir.
func imageFromDir(t *testing.T, dir string) v1.Image {
	t.Helper()
	data, err := tarDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg.OS, cfg.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// tarDir returns a reproducible tar archive of the directories and regular files below dir.
func tarDir(dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if d.IsDir() {
			hdr.Name += "/"
			hdr.Mode, hdr.Typeflag = 0o755, tar.TypeDir
			return tw.WriteHeader(hdr)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: only directories and regular files go into the image", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		hdr.Size = int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	err = tw.Close()
	return buf.Bytes(), err
}

// writeLayout writes images (repository:tag → image) as an OCI image layout in dir.
func writeLayout(t *testing.T, dir string, images map[string]v1.Image) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, repoTag := range sortedKeys(images) {
		if err := p.AppendImage(images[repoTag], layout.WithAnnotations(map[string]string{RefAnnotation: repoTag})); err != nil {
			t.Fatal(err)
		}
	}
}

// kmodImages builds the two kmod images of the test from kernel k in work and returns them by
// repository:tag.
func kmodImages(t *testing.T, k kernel, work string) map[string]v1.Image {
	t.Helper()
	good := filepath.Join(work, "image")
	moduleTree(t, k, filepath.Join(good, "opt"), realModules(t, k, kernelModules...))
	writeFile(t, filepath.Join(good, FirmwareDir, FirmwareName), []byte(FirmwareContent), 0o644)

	const dummyKo = "kernel/drivers/net/dummy.ko"
	wrongKo, err := wrongKernelModule(realModules(t, k, dummyKo)[dummyKo])
	if err != nil {
		t.Fatalf("making the wrong-kernel module: %v", err)
	}
	wrong := filepath.Join(work, "wrong-image")
	moduleTree(t, k, filepath.Join(wrong, "opt"), map[string][]byte{dummyKo: wrongKo})

	return map[string]v1.Image{ImageRepo: imageFromDir(t, good), WrongKernelRepo: imageFromDir(t, wrong)}
}

// writeFile writes data to file, creating its directory.
func writeFile(t *testing.T, file string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, perm); err != nil {
		t.Fatal(err)
	}
}
