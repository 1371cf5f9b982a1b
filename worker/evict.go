package worker

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

// Cache eviction defaults (docs/worker-limits.md).
const (
	// DefaultCacheMaxAge is how long an entry no tag record names stays after its last use.
	DefaultCacheMaxAge = 14 * 24 * time.Hour
	// DefaultCacheBudget is the size the cache is brought back under after a new entry is filled.
	DefaultCacheBudget int64 = 2 << 30
)

// cacheEntry is one digest's directory in the cache, as eviction sees it.
type cacheEntry struct {
	Hex        string
	Size       int64
	LastUsed   time.Time
	Referenced bool // a refs record names it
}

// evictable decides which entries to remove: those no refs record names and not used for maxAge,
// then the least recently used until the rest fits in budget. It is pure.
func evictable(entries []cacheEntry, now time.Time, maxAge time.Duration, budget int64) []string {
	sorted := append([]cacheEntry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].LastUsed.Before(sorted[j].LastUsed) })
	var total int64
	for _, e := range sorted {
		total += e.Size
	}
	var out []string
	for _, e := range sorted {
		if (!e.Referenced && now.Sub(e.LastUsed) > maxAge) || total > budget {
			out = append(out, e.Hex)
			total -= e.Size
		}
	}
	return out
}

// lockFile is the lock a run holds (shared) on a digest while it uses or fills its entry;
// eviction takes it exclusively without waiting and skips the entry when it cannot.
func (c cache) lockFile(hexDigest string) string {
	return filepath.Join(c.dir, "locks", hexDigest)
}

// lock takes the lock of a digest (shared or exclusive, waiting or not) and returns its release.
func (c cache) lock(hexDigest string, how int) (func(), error) {
	file := c.lockFile(hexDigest)
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(file, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil { // #nosec G115 -- a file descriptor fits an int
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}

// use marks the entry of d as used now (its directory's modification time).
func (c cache) use(hexDigest string) {
	now := time.Now()
	_ = os.Chtimes(filepath.Join(c.dir, hexDigest), now, now)
}

// evict removes what evictable picks, skipping entries locked by a running worker.
func (c cache) evict(now time.Time, maxAge time.Duration, budget int64) ([]string, error) {
	entries, err := c.entries()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, h := range evictable(entries, now, maxAge, budget) {
		release, err := c.lock(h, syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			continue // in use (or not lockable): it stays
		}
		err = c.remove(h)
		release()
		if err != nil {
			return removed, err
		}
		removed = append(removed, h)
	}
	return removed, nil
}

// remove moves a digest's directory aside (so that no run sees half of it) and deletes it with its
// access records.
func (c cache) remove(hexDigest string) error {
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	aside := filepath.Join(c.dir, ".evict-"+hexDigest+"-"+hex.EncodeToString(suffix[:]))
	if err := os.Rename(filepath.Join(c.dir, hexDigest), aside); err != nil {
		return fmt.Errorf("evicting %s: %w", hexDigest, err)
	}
	_ = os.RemoveAll(filepath.Join(c.dir, "access", hexDigest))
	return os.RemoveAll(aside)
}

// entries lists the digest directories with their size, last use and whether a refs record names them.
func (c cache) entries() ([]cacheEntry, error) {
	dirs, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, err
	}
	refs := c.referenced()
	var out []cacheEntry
	for _, d := range dirs {
		if !d.IsDir() || !isHexDigest(d.Name()) {
			continue
		}
		info, err := d.Info()
		if err != nil {
			continue
		}
		out = append(out, cacheEntry{Hex: d.Name(), Size: dirSize(filepath.Join(c.dir, d.Name())), LastUsed: info.ModTime(), Referenced: refs[d.Name()]})
	}
	return out, nil
}

// referenced returns the digests the refs records name.
func (c cache) referenced() map[string]bool {
	out := map[string]bool{}
	files, _ := os.ReadDir(filepath.Join(c.dir, "refs"))
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(c.dir, "refs", f.Name()))
		var rec refRecord
		if err != nil || json.Unmarshal(data, &rec) != nil {
			continue
		}
		if h, err := parseHash(rec.Digest); err == nil {
			out[h] = true
		}
	}
	return out
}

func isHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func parseHash(s string) (string, error) {
	if len(s) != len("sha256:")+64 || s[:7] != "sha256:" || !isHexDigest(s[7:]) {
		return "", errors.New("not a sha256 digest")
	}
	return s[7:], nil
}

// dirSize is the size of the files below dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
