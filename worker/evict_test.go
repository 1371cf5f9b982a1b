package worker

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kmm-project/kmm/contract"
)

func TestEvictable(t *testing.T) {
	now := time.Date(2026, 1, 30, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	e := func(h string, size int64, age time.Duration, ref bool) cacheEntry {
		return cacheEntry{Hex: h, Size: size, LastUsed: now.Add(-age), Referenced: ref}
	}
	cases := []struct {
		name    string
		entries []cacheEntry
		budget  int64
		want    []string
	}{
		{"recent entries under budget stay", []cacheEntry{e("a", 10, day, false), e("b", 10, 2*day, true)}, 100, nil},
		{"old unreferenced goes, old referenced stays", []cacheEntry{e("a", 10, 20*day, false), e("b", 10, 30*day, true)}, 100, []string{"a"}},
		{"over budget: least recently used first", []cacheEntry{e("new", 50, day, true), e("mid", 50, 2*day, true), e("old", 50, 3*day, true)}, 100, []string{"old"}},
		{"over budget after the old ones went", []cacheEntry{e("x", 80, day, true), e("y", 80, 20*day, false), e("z", 80, 2*day, true)}, 100, []string{"y", "z"}},
	}
	for _, tc := range cases {
		if got := evictable(tc.entries, now, 14*day, tc.budget); !slices.Equal(got, tc.want) {
			t.Errorf("%s: evict %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestEvictionSkipsEntriesInUse: after a new entry is filled, old unreferenced entries go, but an
// entry locked by a worker running now stays, and so does the new one.
func TestEvictionSkipsEntriesInUse(t *testing.T) {
	s := newSandbox(t)
	c := cache{dir: s.cache}
	old := time.Now().Add(-30 * 24 * time.Hour)
	var hexes []string
	for _, h := range []string{strings.Repeat("a", 64), strings.Repeat("b", 64)} {
		dir := filepath.Join(s.cache, h, "key")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "m.ko"), []byte("module"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(s.cache, h), old, old); err != nil {
			t.Fatal(err)
		}
		hexes = append(hexes, h)
	}
	release, err := c.lock(hexes[1], syscall.LOCK_SH) // another worker is using b
	if err != nil {
		t.Fatal(err)
	}
	defer release()

	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	mustSucceed(t, newTestWorker(t, s, newRecorder(t)).Run(context.Background(), contract.ActionLoad, testConfig(ref)))

	for h, want := range map[string]bool{hexes[0]: false, hexes[1]: true, digest.Hex: true} {
		if _, err := os.Stat(filepath.Join(s.cache, h)); (err == nil) != want {
			t.Errorf("entry %s… present = %v, want %v", h[:8], err == nil, want)
		}
	}
	// With a budget smaller than the new entry, nothing in use goes either.
	ref2, digest2 := reg.push(t, "kmod/other:v1", image(t, append(kmodEntries(t, "opt"), file("opt/lib/modules/"+testKernel+"/x", "2"))))
	mustSucceed(t, newTestWorker(t, s, newRecorder(t), func(o *Options) { o.CacheBudget = 1 }).Run(context.Background(), contract.ActionLoad, testConfig(ref2)))
	for h, want := range map[string]bool{hexes[1]: true, digest.Hex: false, digest2.Hex: true} {
		if _, err := os.Stat(filepath.Join(s.cache, h)); (err == nil) != want {
			t.Errorf("over budget: entry %s… present = %v, want %v", h[:8], err == nil, want)
		}
	}
}
