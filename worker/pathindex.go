package worker

import (
	"path"
	"sort"
	"strings"
)

// extracted is what the extractor wrote at a path, and in which layer.
type extracted struct {
	layer int
	kind  entryAction
}

// pathIndex records the paths an extraction wrote as a tree of path components, so that a
// whiteout visits only what is below the path it removes, and of that only the subtrees that still
// hold something to remove: the work of an image is linear in its entries, not entries × whiteouts
// nor directories × layers.
type pathIndex struct {
	root pathNode
	// visits counts the nodes visited, for the tests that check the work is linear.
	visits int
}

type pathNode struct {
	children map[string]*pathNode
	entry    extracted
	set      bool
	// files counts the recorded entries that are not directories at this node and below it: a
	// whiteout removes only those, so it skips a subtree where files is 0.
	files int
	// wiped is 1 + the layer of the last whiteout that covered everything below this node: in
	// that layer, nothing below is left to remove.
	wiped int
}

// fileCount is 1 when the node records an entry that is not a directory.
func (n *pathNode) fileCount() int {
	if n.set && n.entry.kind != mkdirEntry {
		return 1
	}
	return 0
}

// components splits a clean relative path; "." is the root.
func components(p string) []string {
	if p == "." || p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// put records e at p. A file or a link replaces whatever was below p.
func (ix *pathIndex) put(p string, e extracted) {
	cs := components(p)
	n := &ix.root
	for _, c := range cs {
		ix.visits++
		if n.children == nil {
			n.children = map[string]*pathNode{}
		}
		child := n.children[c]
		if child == nil {
			child = &pathNode{}
			n.children[c] = child
		}
		n = child
	}
	before := n.files
	n.files -= n.fileCount()
	n.entry, n.set = e, true
	if e.kind != mkdirEntry {
		n.children, n.files = nil, 0
	}
	n.files += n.fileCount()
	ix.addFiles(cs, n.files-before)
}

// addFiles adds delta to the file counts of the ancestors of the path cs (not the path itself).
func (ix *pathIndex) addFiles(cs []string, delta int) {
	if delta == 0 || len(cs) == 0 {
		return
	}
	n := &ix.root
	for _, c := range cs {
		ix.visits++
		n.files += delta
		n = n.children[c]
	}
}

// get returns what was recorded at p.
func (ix *pathIndex) get(p string) (extracted, bool) {
	n := ix.find(p, -1)
	if n == nil || !n.set {
		return extracted{}, false
	}
	return n.entry, true
}

// find returns the node of p, or nil when nothing was recorded there or (layer >= 0) when a
// whiteout of layer already covered p.
func (ix *pathIndex) find(p string, layer int) *pathNode {
	n := &ix.root
	for _, c := range components(p) {
		ix.visits++
		if layer >= 0 && n.wiped == layer+1 {
			return nil
		}
		if n = n.children[c]; n == nil {
			return nil
		}
	}
	return n
}

// wipe removes the entries of lower layers than layer below p, and p itself when self is set,
// calling remove for each. Directories and the entries of layer itself stay on disk, as the OCI
// layer format requires. Each node is visited at most once per layer; a subtree of directories
// only is dropped from the index when a whiteout reaches it.
func (ix *pathIndex) wipe(p string, self bool, layer int, remove func(string) error) error {
	n := ix.find(p, layer)
	if n == nil {
		return nil
	}
	removed := 0
	var err error
	if self {
		removed, err = n.removeEntry(p, layer, remove)
	}
	if err == nil {
		var below int
		below, err = n.wipeBelow(p, layer, remove, &ix.visits)
		removed += below
	}
	ix.addFiles(components(p), -removed)
	return err
}

// removeEntry removes the node's own entry if a lower layer wrote it and it is not a directory,
// and returns how many entries it removed (0 or 1).
func (n *pathNode) removeEntry(p string, layer int, remove func(string) error) (int, error) {
	if !n.set || n.entry.layer >= layer || n.entry.kind == mkdirEntry {
		return 0, nil
	}
	if err := remove(p); err != nil {
		return 0, err
	}
	n.set = false
	n.files--
	return 1, nil
}

// wipeBelow removes the entries of lower layers below n and returns how many it removed; the file
// counts of n and below are kept up to date.
func (n *pathNode) wipeBelow(p string, layer int, remove func(string) error, visits *int) (int, error) {
	if n.wiped == layer+1 {
		return 0, nil
	}
	removed := 0
	defer func() { n.files -= removed }()
	for name, child := range n.children {
		*visits++
		if child.files == 0 {
			// Directories only: nothing to remove, nor anything a later entry needs from the
			// index (hard links and the symlink check look for files and links). Dropping the
			// subtree keeps the next whiteout from iterating over it again: each node is dropped
			// once, so the work stays linear in the entries however many layers there are.
			delete(n.children, name)
			continue
		}
		cp := path.Join(p, name)
		r, err := child.removeEntry(cp, layer, remove)
		removed += r
		if err != nil {
			return removed, err
		}
		r, err = child.wipeBelow(cp, layer, remove, visits)
		removed += r
		if err != nil {
			return removed, err
		}
		if !child.set && len(child.children) == 0 {
			delete(n.children, name)
		}
	}
	n.wiped = layer + 1
	return removed, nil
}

// walk calls fn for every recorded path, in lexical order.
func (ix *pathIndex) walk(fn func(p string, e extracted) error) error {
	return ix.root.walk(".", fn)
}

func (n *pathNode) walk(p string, fn func(string, extracted) error) error {
	if n.set {
		if err := fn(p, n.entry); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(n.children))
	for name := range n.children {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := n.children[name].walk(path.Join(p, name), fn); err != nil {
			return err
		}
	}
	return nil
}
