package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// node is one file system entry read from a Debian package.
type node struct {
	Type byte   // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	Mode int64  // permission bits as the package has them
	Link string // symlink target, as the package has it
	Data []byte // regular file content
	Pkg  string // package that ships it ("" for the merged-/usr links)
}

// tree is the union of the file systems of some Debian packages, keyed by clean relative path
// ("usr/bin/kmod"), with Debian's merged-/usr layout: a package's /bin, /sbin and /lib* entries
// live under usr/, and bin, sbin, lib and lib64 are symlinks into it, as on a Debian 12 system.
type tree map[string]*node

// mergedUsr are the top-level directories that are symlinks into /usr on a merged-/usr system.
var mergedUsr = []string{"bin", "sbin", "lib", "lib64"}

func newTree() tree {
	t := tree{}
	for _, d := range mergedUsr {
		t[d] = &node{Type: tar.TypeSymlink, Mode: 0o777, Link: "usr/" + d}
	}
	return t
}

// canonical returns the tree key of a path inside a package: clean, relative, merged into /usr.
func canonical(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	first, _, _ := strings.Cut(p, "/")
	for _, d := range mergedUsr {
		if first == d {
			return "usr/" + p
		}
	}
	return p
}

// addPackage adds the entries of a package's data archive (dpkg-deb --fsys-tarfile), merged into
// /usr. A path two packages ship differently is an error; hard links become copies of their target.
func (t tree) addPackage(pkg string, r io.Reader) error { return t.addArchive(pkg, r, canonical) }

// addArchive adds the entries of a tar archive, each under the key key returns for its name.
func (t tree) addArchive(pkg string, r io.Reader, key func(string) string) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading package %s: %w", pkg, err)
		}
		name := key(hdr.Name)
		if name == "" {
			continue
		}
		n, err := t.entry(pkg, hdr, tr, key)
		if err != nil {
			return err
		}
		if err := t.put(name, n); err != nil {
			return err
		}
	}
}

// entry returns the node of one archive entry.
func (t tree) entry(pkg string, hdr *tar.Header, r io.Reader, key func(string) string) (*node, error) {
	n := &node{Type: hdr.Typeflag, Mode: hdr.Mode & 0o7777, Pkg: pkg}
	switch hdr.Typeflag {
	case tar.TypeDir:
	case tar.TypeSymlink:
		n.Link = hdr.Linkname
	case tar.TypeReg:
		data, err := io.ReadAll(r)
		if err != nil {
			return nil, fmt.Errorf("reading %s of package %s: %w", hdr.Name, pkg, err)
		}
		n.Data = data
	case tar.TypeLink:
		target := t[key(hdr.Linkname)]
		if target == nil || target.Type != tar.TypeReg {
			return nil, fmt.Errorf("package %s: hard link %s to %s, which is no regular file before it", pkg, hdr.Name, hdr.Linkname)
		}
		n.Type, n.Data, n.Mode = tar.TypeReg, target.Data, target.Mode
	default:
		return nil, fmt.Errorf("package %s: %s has tar type %q, which the images do not take", pkg, hdr.Name, hdr.Typeflag)
	}
	return n, nil
}

// put adds n at name unless an equal entry is there; a different one is an error.
func (t tree) put(name string, n *node) error {
	old := t[name]
	if old == nil {
		t[name] = n
		return nil
	}
	if old.Type == tar.TypeDir && n.Type == tar.TypeDir {
		return nil
	}
	if old.Type != n.Type || old.Link != n.Link || !bytes.Equal(old.Data, n.Data) {
		return fmt.Errorf("%s is shipped by both %s and %s, differently", name, old.Pkg, n.Pkg)
	}
	return nil
}

// resolve follows p (absolute or relative to the root) through the tree's symlinks to a regular
// file. It returns the file's key and every key it went through: the symlinks, then the file.
func (t tree) resolve(p string) (string, []string, error) {
	var visited []string
	parts := splitPath(p)
	cur := ""
	for hops := 0; len(parts) > 0; {
		next := path.Join(cur, parts[0])
		rest := parts[1:]
		n := t[next]
		if n == nil {
			return "", nil, fmt.Errorf("%s: /%s does not exist", p, next)
		}
		switch n.Type {
		case tar.TypeSymlink:
			if hops++; hops > 40 {
				return "", nil, fmt.Errorf("%s: too many levels of symbolic links", p)
			}
			visited = append(visited, next)
			base := cur
			if path.IsAbs(n.Link) {
				base = ""
			}
			parts = splitPath(path.Join(append([]string{base, n.Link}, rest...)...))
			cur = ""
		case tar.TypeDir:
			cur, parts = next, rest
		default:
			if len(rest) > 0 {
				return "", nil, fmt.Errorf("%s: /%s is not a directory", p, next)
			}
			cur, parts = next, rest
		}
	}
	if n := t[cur]; n == nil || n.Type != tar.TypeReg {
		return "", nil, fmt.Errorf("%s is not a regular file", p)
	}
	return cur, append(visited, cur), nil
}

func splitPath(p string) []string {
	p = strings.Trim(path.Clean("/"+p), "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// closure is what it takes to run some programs of a tree.
type closure struct {
	Keys       []string // every entry needed: the programs, libraries and loader, and the symlinks to them
	Unresolved []string // libraries (or loaders) no package of the tree has
	Owners     []string // packages of the ELF files in the closure
}

// closure follows the programs' dynamic loader (PT_INTERP) and DT_NEEDED libraries, transitively,
// looking libraries up where the dynamic loader does without a cache on Debian: the multiarch
// directory, then lib, each under / and /usr.
func (t tree) closure(p platform, programs []string) (closure, error) {
	keys := map[string]bool{}
	owners := map[string]bool{}
	var unresolved []string
	done := map[string]bool{}
	queue := append([]string(nil), programs...)
	for len(queue) > 0 {
		prog := queue[0]
		queue = queue[1:]
		file, visited, err := t.resolve(prog)
		if err != nil {
			return closure{}, err
		}
		for _, k := range visited {
			keys[k] = true
		}
		if done[file] {
			continue
		}
		done[file] = true
		n := t[file]
		owners[n.Pkg] = true
		interp, needed, err := dynamic(n.Data, p)
		if err != nil {
			return closure{}, fmt.Errorf("/%s: %w", file, err)
		}
		if interp != "" {
			if _, _, err := t.resolve(interp); err != nil {
				unresolved = append(unresolved, interp)
			} else {
				queue = append(queue, interp)
			}
		}
		for _, lib := range needed {
			found := ""
			for _, dir := range []string{"lib/" + p.Triplet, "usr/lib/" + p.Triplet, "lib", "usr/lib"} {
				cand := path.Join(dir, lib)
				if strings.Contains(lib, "/") {
					cand = lib
				}
				if _, _, err := t.resolve(cand); err == nil {
					found = cand
					break
				}
			}
			if found == "" {
				unresolved = append(unresolved, lib)
				continue
			}
			queue = append(queue, found)
		}
	}
	return closure{Keys: sortedKeys(keys), Unresolved: unresolved, Owners: sortedKeys(owners)}, nil
}

// dynamic reads an ELF file of platform p and returns its program interpreter ("" for none) and
// the shared libraries it needs.
func dynamic(data []byte, p platform) (string, []string, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = f.Close() }()
	if f.Machine != p.Machine || f.Class != elf.ELFCLASS64 {
		return "", nil, fmt.Errorf("an ELF file for %s/%s, not for %s", f.Class, f.Machine, p)
	}
	interp, linked := "", false
	for _, prog := range f.Progs {
		switch prog.Type {
		case elf.PT_DYNAMIC:
			linked = true
		case elf.PT_INTERP:
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return "", nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if !linked {
		return interp, nil, nil
	}
	for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
		if v, err := f.DynString(tag); err == nil && len(v) > 0 {
			return "", nil, fmt.Errorf("%s %q: library search paths other than the system's are not supported", tag, v)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return "", nil, err
	}
	return interp, needed, nil
}

// checkStatic returns an error unless data is a statically linked ELF executable for p.
func checkStatic(data []byte, p platform) error {
	interp, needed, err := dynamic(data, p)
	if err != nil {
		return err
	}
	if interp != "" || len(needed) > 0 {
		return fmt.Errorf("dynamically linked (interpreter %q, libraries %v); build it with CGO_ENABLED=0", interp, needed)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// kmodPrograms are the worker image's programs from Debian's kmod package: modprobe and depmod
// where the package puts them (/sbin), and modprobe where the worker runs it (--modprobe, default
// /usr/sbin/modprobe); both paths work in the image, as on Debian.
var kmodPrograms = []string{"sbin/modprobe", "sbin/depmod", "usr/sbin/modprobe"}

// kmodFiles fetches kmod for p and, round by round, the dependencies of the packages whose ELF
// files need a library or loader not yet there, and returns the tree and the closure of
// kmodPrograms in it.
func (d *debian) kmodFiles(ctx context.Context, p platform) (tree, closure, error) {
	return d.programFiles(ctx, p, []string{"kmod"}, kmodPrograms)
}

// programFiles fetches the packages roots for p and, round by round, the dependencies of the
// packages whose ELF files need a library or loader not yet there, and returns the tree and the
// closure of programs in it.
func (d *debian) programFiles(ctx context.Context, p platform, roots, programs []string) (tree, closure, error) {
	t := newTree()
	have := map[string]bool{}
	deps := map[string][]string{}
	want := roots
	for {
		if err := d.addPackages(ctx, p, t, want, have, deps); err != nil {
			return nil, closure{}, err
		}
		c, err := t.closure(p, programs)
		if err != nil {
			return nil, closure{}, err
		}
		if len(c.Unresolved) == 0 {
			return t, c, nil
		}
		want = nil
		for _, owner := range c.Owners {
			for _, dep := range deps[owner] {
				if !have[dep] {
					want = append(want, dep)
				}
			}
		}
		if len(want) == 0 {
			return nil, closure{}, fmt.Errorf("%s: no package among %v and their dependencies has %v", p, sortedKeys(have), c.Unresolved)
		}
		sort.Strings(want)
		want = compactStrings(want)
	}
}

// addPackages fetches pkgs and reads those not yet had into t, recording their dependencies.
func (d *debian) addPackages(ctx context.Context, p platform, t tree, pkgs []string, have map[string]bool, deps map[string][]string) error {
	debs, err := d.fetch(ctx, p.GOARCH, pkgs)
	if err != nil {
		return err
	}
	for _, pkg := range sortedKeys(debs) {
		if have[pkg] {
			continue
		}
		have[pkg] = true
		data, err := dpkgDeb(ctx, "--fsys-tarfile", debs[pkg])
		if err != nil {
			return err
		}
		if err := t.addPackage(pkg, bytes.NewReader(data)); err != nil {
			return err
		}
		if deps[pkg], err = depends(ctx, debs[pkg]); err != nil {
			return err
		}
	}
	return nil
}

func compactStrings(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// caBundlePath is where Go's crypto/x509 (and Debian) look for the CA bundle.
const caBundlePath = "etc/ssl/certs/ca-certificates.crt"

// caBundle builds /etc/ssl/certs/ca-certificates.crt from Debian's ca-certificates package the way
// update-ca-certificates does on a fresh install: every certificate under
// /usr/share/ca-certificates/mozilla in byte order, each ending in a newline. The package is
// architecture-independent; it is fetched through p's apt state.
func (d *debian) caBundle(ctx context.Context, p platform) ([]byte, error) {
	debs, err := d.fetch(ctx, p.GOARCH, []string{"ca-certificates"})
	if err != nil {
		return nil, err
	}
	data, err := dpkgDeb(ctx, "--fsys-tarfile", debs["ca-certificates"])
	if err != nil {
		return nil, err
	}
	t := tree{}
	if err := t.addPackage("ca-certificates", bytes.NewReader(data)); err != nil {
		return nil, err
	}
	var bundle bytes.Buffer
	for _, k := range sortedKeys(t) {
		if n := t[k]; n.Type == tar.TypeReg && path.Dir(k) == "usr/share/ca-certificates/mozilla" && strings.HasSuffix(k, ".crt") {
			bundle.Write(n.Data)
			if len(n.Data) > 0 && n.Data[len(n.Data)-1] != '\n' {
				bundle.WriteByte('\n')
			}
		}
	}
	if bundle.Len() == 0 {
		return nil, errors.New("package ca-certificates has no /usr/share/ca-certificates/mozilla/*.crt")
	}
	return bundle.Bytes(), nil
}
