package worker

import (
	"archive/tar"
	"fmt"
	"path"
	"strings"

	"github.com/kmm-project/kmm/contract"
)

// entryAction is what the extractor does with one archive entry.
type entryAction int

// The extractor's actions.
const (
	skipEntry entryAction = iota
	mkdirEntry
	fileEntry
	symlinkEntry
	hardlinkEntry
	hostLinkEntry // the link <kernel dir>/host to the node's module tree of the same kernel
	whiteoutEntry // remove Path (and what is below it) as extracted from lower layers
	opaqueEntry   // remove what is below Path as extracted from lower layers
)

// entryPlan is the decision for one archive entry. Path and Target are clean and relative to the
// extraction root.
type entryPlan struct {
	Action entryAction
	Path   string
	// Target is the link target: for a symlink the text to store (relative), for a hard link the
	// extraction-root-relative path of the file it links to.
	Target string
}

// unsafeEntryError says which archive entry was refused and why.
type unsafeEntryError struct {
	Name string
	Why  string
}

func (e *unsafeEntryError) Error() string {
	return fmt.Sprintf("unsafe archive entry %q: %s", e.Name, e.Why)
}

// filter says which parts of the image are extracted: the subtrees Dirs (clean, relative, non-empty).
type filter struct {
	Dirs []string
	// HostLink is the one entry that may link out of the image: <dirName>/lib/modules/<kernel>/host,
	// whose target must be HostLinkTarget (contract.HostModulesDir/<kernel>, as the image stores
	// it); it is extracted as a link to HostTarget (where the worker sees the node's tree of that
	// kernel). HostTarget "" refuses it (no node tree mounted).
	HostLink, HostLinkTarget, HostTarget string
}

// wants reports whether p is inside one of the extracted subtrees.
func (f filter) wants(p string) bool {
	for _, d := range f.Dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// touches reports whether removing p (a whiteout) can affect an extracted subtree.
func (f filter) touches(p string) bool {
	if p == "." || f.wants(p) {
		return true
	}
	for _, d := range f.Dirs {
		if strings.HasPrefix(d, p+"/") {
			return true
		}
	}
	return false
}

// cleanEntryName checks an archive path (an entry's name or a hard link's target) and returns it
// clean and relative: absolute paths and ".." components are refused wherever they appear.
func cleanEntryName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", &unsafeEntryError{Name: name, Why: "absolute path"}
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", &unsafeEntryError{Name: name, Why: `".." path component`}
		}
	}
	if strings.ContainsRune(name, 0) {
		return "", &unsafeEntryError{Name: name, Why: "NUL byte in path"}
	}
	return path.Clean(name), nil
}

// planEntry decides what to do with one archive entry, refusing unsafe ones. It is pure.
func planEntry(hdr *tar.Header, f filter) (entryPlan, error) {
	p, err := cleanEntryName(hdr.Name)
	if err != nil || p == "." {
		return entryPlan{}, err
	}
	dir, base := path.Dir(p), path.Base(p)
	if base == ".wh..wh..opq" {
		return whiteoutPlan(opaqueEntry, dir, f), nil
	}
	if strings.HasPrefix(base, ".wh.") {
		return whiteoutPlan(whiteoutEntry, path.Join(dir, strings.TrimPrefix(base, ".wh.")), f), nil
	}
	if !f.wants(p) {
		return entryPlan{}, nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return entryPlan{Action: mkdirEntry, Path: p}, nil
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old archives still use TypeRegA for files
		return entryPlan{Action: fileEntry, Path: p}, nil
	case tar.TypeSymlink:
		return f.symlinkPlan(hdr, p, dir)
	case tar.TypeLink:
		target, err := cleanEntryName(hdr.Linkname)
		if err != nil {
			return entryPlan{}, &unsafeEntryError{Name: hdr.Name, Why: fmt.Sprintf("hard link to %q outside the extraction root", hdr.Linkname)}
		}
		if !f.wants(target) {
			return entryPlan{}, &unsafeEntryError{Name: hdr.Name, Why: fmt.Sprintf("hard link to %q, which is outside the extracted directories %s", hdr.Linkname, strings.Join(f.Dirs, ", "))}
		}
		return entryPlan{Action: hardlinkEntry, Path: p, Target: target}, nil
	case tar.TypeChar, tar.TypeBlock:
		return entryPlan{}, &unsafeEntryError{Name: hdr.Name, Why: "device file"}
	case tar.TypeFifo:
		return entryPlan{}, &unsafeEntryError{Name: hdr.Name, Why: "named pipe (fifo)"}
	default:
		return entryPlan{}, &unsafeEntryError{Name: hdr.Name, Why: fmt.Sprintf("unsupported entry type %q", hdr.Typeflag)}
	}
}

func whiteoutPlan(action entryAction, p string, f filter) entryPlan {
	if !f.touches(p) {
		return entryPlan{}
	}
	return entryPlan{Action: action, Path: p}
}

// symlinkPlan decides on a symlink at p (in directory dir): the host link, or a link of the image.
func (f filter) symlinkPlan(hdr *tar.Header, p, dir string) (entryPlan, error) {
	if host, err := f.hostLink(hdr.Name, p, hdr.Linkname); host || err != nil {
		return entryPlan{Action: hostLinkEntry, Path: p, Target: f.HostTarget}, err
	}
	target, err := symlinkTarget(hdr.Name, dir, hdr.Linkname)
	return entryPlan{Action: symlinkEntry, Path: p, Target: target}, err
}

// hostLink reports whether the symlink at p (named name in the archive) with target is the host
// link. A link into the node's filesystem (an absolute target below /host, where worker pods see
// the node) that is not exactly the host link is refused: another kernel's tree, a subdirectory,
// another place in the image, or a worker that does not see the node's tree.
func (f filter) hostLink(name, p, target string) (bool, error) {
	clean := path.Clean(target)
	if f.HostLink == "" || !strings.HasPrefix(target, "/") || (clean != hostPrefix && !strings.HasPrefix(clean, hostPrefix+"/")) {
		return false, nil
	}
	switch {
	case p != f.HostLink:
		return false, &unsafeEntryError{Name: name, Why: fmt.Sprintf("symlink to %q into the node's filesystem: only %s may link there", target, f.HostLink)}
	case clean != f.HostLinkTarget:
		return false, &unsafeEntryError{Name: name, Why: fmt.Sprintf("the host link must point to %s (the node's modules of this kernel), not %q", f.HostLinkTarget, target)}
	case f.HostTarget == "":
		return false, &unsafeEntryError{Name: name, Why: "the host link needs the node's /lib/modules, which this worker does not see"}
	}
	return true, nil
}

// hostPrefix is where worker pods see the node's directories (contract.HostModulesDir is below it).
var hostPrefix = path.Dir(path.Dir(contract.HostModulesDir))

// symlinkTarget checks the target of a symlink at dir/… and returns the text to store. An absolute
// target means a path of the image, so it is rewritten relative to the link (it then resolves inside
// the extraction root); a relative target that climbs out of the root is refused.
func symlinkTarget(name, dir, target string) (string, error) {
	if target == "" || strings.ContainsRune(target, 0) {
		return "", &unsafeEntryError{Name: name, Why: "symlink with an empty or invalid target"}
	}
	if strings.HasPrefix(target, "/") {
		rel := imageRel(target)
		if rel == "" {
			rel = "."
		}
		return relativeFrom(dir, rel), nil
	}
	resolved := path.Join(dir, target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return "", &unsafeEntryError{Name: name, Why: fmt.Sprintf("symlink to %q, which points outside the extraction root", target)}
	}
	return target, nil
}

// relativeFrom returns the relative path from directory dir to p, both clean and relative to the
// same root.
func relativeFrom(dir, p string) string {
	if dir == "." {
		return p
	}
	up := strings.Repeat("../", strings.Count(dir, "/")+1)
	return path.Clean(up + p)
}
