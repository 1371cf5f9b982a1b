package worker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPathIndexWhiteouts(t *testing.T) {
	f := func(layer int) extracted { return extracted{layer: layer, kind: fileEntry} }
	d := func(layer int) extracted { return extracted{layer: layer, kind: mkdirEntry} }
	setup := func() *pathIndex {
		ix := &pathIndex{}
		ix.put("a", d(0))
		ix.put("a/x", f(0))
		ix.put("a/sub/y", f(0))
		ix.put("a/new", f(1)) // written by the layer of the whiteouts: stays
		ix.put("b", f(0))
		return ix
	}
	cases := []struct {
		name    string
		path    string
		self    bool
		removed []string
	}{
		{"whiteout of a file", "b", true, []string{"b"}},
		{"whiteout of a directory removes its lower files, keeps directories and this layer's files", "a", true, []string{"a/sub/y", "a/x"}},
		{"opaque directory", "a", false, []string{"a/sub/y", "a/x"}},
		{"opaque root", ".", false, []string{"a/sub/y", "a/x", "b"}},
		{"nothing there", "c/d", true, nil},
	}
	for _, tc := range cases {
		ix := setup()
		var removed []string
		if err := ix.wipe(tc.path, tc.self, 1, func(p string) error { removed = append(removed, p); return nil }); err != nil {
			t.Fatal(err)
		}
		slices.Sort(removed)
		if !slices.Equal(removed, tc.removed) {
			t.Errorf("%s: removed %q, want %q", tc.name, removed, tc.removed)
		}
		if _, ok := ix.get("a/new"); !ok {
			t.Errorf("%s: this layer's file was dropped", tc.name)
		}
		for _, p := range removed {
			if _, ok := ix.get(p); ok {
				t.Errorf("%s: %s still recorded", tc.name, p)
			}
		}
	}
}

// TestPathIndexWorkIsLinear: whiteouts of every file, and opaque markers of every directory on a
// deep chain, visit each recorded path a bounded number of times per layer.
func TestPathIndexWorkIsLinear(t *testing.T) {
	const n = 2000
	ix := &pathIndex{}
	dirPath := "."
	for i := range n {
		dirPath = fmt.Sprintf("%s/d%d", dirPath, i)[len("./")*boolInt(i == 0):]
		ix.put(dirPath, extracted{layer: 0, kind: mkdirEntry})
		ix.put(dirPath+"/f", extracted{layer: 0, kind: fileEntry})
	}
	calls := 0
	remove := func(string) error { calls++; return nil }
	// Opaque markers from the top of the chain down: each one is already covered.
	p := "."
	for i := range n {
		p = fmt.Sprintf("%s/d%d", p, i)[len("./")*boolInt(i == 0):]
		if err := ix.wipe(p, false, 1, remove); err != nil {
			t.Fatal(err)
		}
	}
	if calls != n {
		t.Errorf("%d removals, want %d", calls, n)
	}
	visited := 0
	_ = ix.walk(func(string, extracted) error { visited++; return nil })
	if visited != n {
		t.Errorf("%d paths left, want the %d directories", visited, n)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestPathIndexFileCounts applies random puts and whiteouts and checks each node's count of the
// entries below it that are not directories, which whiteouts rely on to skip subtrees.
func TestPathIndexFileCounts(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 34))
	names := []string{"a", "b", "c"}
	randPath := func() string {
		p := names[rng.IntN(3)]
		for range rng.IntN(4) {
			p += "/" + names[rng.IntN(3)]
		}
		return p
	}
	ix := &pathIndex{}
	for layer := range 40 {
		for range 30 {
			switch p := randPath(); rng.IntN(4) {
			case 0:
				ix.put(p, extracted{layer: layer, kind: mkdirEntry})
			case 1, 2:
				ix.put(p, extracted{layer: layer, kind: fileEntry})
			default:
				if err := ix.wipe(p, rng.IntN(2) == 0, layer, func(string) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			checkCounts(t, &ix.root, ".")
		}
	}
}

func checkCounts(t *testing.T, n *pathNode, p string) int {
	t.Helper()
	want := n.fileCount()
	for name, c := range n.children {
		want += checkCounts(t, c, p+"/"+name)
	}
	if n.files != want {
		t.Fatalf("%s: files = %d, want %d", p, n.files, want)
	}
	return want
}
