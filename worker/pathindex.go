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
// whiteout visits only what is below the path it removes (the work of a layer is linear in its
// entries, not entries × whiteouts).
type pathIndex struct {
	root pathNode
}

type pathNode struct {
	children map[string]*pathNode
	entry    extracted
	set      bool
	// wiped is 1 + the layer of the last whiteout that covered everything below this node: in
	// that layer, nothing below is left to remove.
	wiped int
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
	n := &ix.root
	for _, c := range components(p) {
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
	n.entry, n.set = e, true
	if e.kind != mkdirEntry {
		n.children = nil
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
// calling remove for each. Directories and the entries of layer itself stay, as the OCI layer
// format requires. Each node is visited at most once per layer.
func (ix *pathIndex) wipe(p string, self bool, layer int, remove func(string) error) error {
	n := ix.find(p, layer)
	if n == nil {
		return nil
	}
	if self {
		if err := n.removeEntry(p, layer, remove); err != nil {
			return err
		}
	}
	return n.wipeBelow(p, layer, remove)
}

// removeEntry removes the node's own entry if a lower layer wrote it and it is not a directory.
func (n *pathNode) removeEntry(p string, layer int, remove func(string) error) error {
	if !n.set || n.entry.layer >= layer || n.entry.kind == mkdirEntry {
		return nil
	}
	if err := remove(p); err != nil {
		return err
	}
	n.set = false
	return nil
}

func (n *pathNode) wipeBelow(p string, layer int, remove func(string) error) error {
	if n.wiped == layer+1 {
		return nil
	}
	for name, child := range n.children {
		cp := path.Join(p, name)
		if err := child.removeEntry(cp, layer, remove); err != nil {
			return err
		}
		if err := child.wipeBelow(cp, layer, remove); err != nil {
			return err
		}
		if !child.set && len(child.children) == 0 {
			delete(n.children, name)
		}
	}
	n.wiped = layer + 1
	return nil
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
