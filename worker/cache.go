package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// cache is the digest-keyed store of extracted images described in the package documentation.
type cache struct {
	dir string
	// staleAfter, when longer than staleExtraction, is how old an unfinished extraction must be
	// before it is removed (twice the run deadline: no running extraction is that old).
	staleAfter time.Duration
}

// staleExtraction is how old an unfinished extraction directory must be before a run removes it.
const staleExtraction = time.Hour

// extractKey names the subtree selection of mc (kernel, dirName, firmwarePath) inside a digest's entry.
func extractKey(mc kmmv1beta1.ModuleConfig) string {
	sum := sha256.Sum256([]byte(mc.KernelVersion + "\x00" + modulesRoot(mc) + "\x00" + firmwareDir(mc)))
	return hex.EncodeToString(sum[:8])
}

// entry is the extraction root of digest d for the selection key.
func (c cache) entry(d v1.Hash, key string) string {
	return filepath.Join(c.dir, d.Hex, key)
}

// has reports whether the entry exists; entries appear complete, by rename.
func (c cache) has(d v1.Hash, key string) bool {
	st, err := os.Stat(c.entry(d, key))
	return err == nil && st.IsDir()
}

type refRecord struct {
	Reference string `json:"reference"`
	Digest    string `json:"digest"`
}

func (c cache) refFile(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return filepath.Join(c.dir, "refs", hex.EncodeToString(sum[:])+".json")
}

// lookupRef returns the digest ref last resolved to, if recorded.
func (c cache) lookupRef(ref string) (v1.Hash, bool) {
	data, err := os.ReadFile(c.refFile(ref))
	if err != nil {
		return v1.Hash{}, false
	}
	var rec refRecord
	if json.Unmarshal(data, &rec) != nil || rec.Reference != ref {
		return v1.Hash{}, false
	}
	h, err := v1.NewHash(rec.Digest)
	return h, err == nil
}

// recordRef remembers that ref resolved to d (written to a temporary file and renamed).
func (c cache) recordRef(ref string, d v1.Hash) error {
	file := c.refFile(ref)
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return err
	}
	data, err := json.Marshal(refRecord{Reference: ref, Digest: d.String()})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".ref-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// fill extracts img into the entry of (d, key): into a temporary directory of the cache first,
// renamed into place only when complete, so that a crash never leaves an entry a later run trusts.
func (c cache) fill(ctx context.Context, d v1.Hash, key string, img v1.Image, spec extractSpec) error {
	if err := os.MkdirAll(filepath.Join(c.dir, d.Hex), 0o750); err != nil {
		return fmt.Errorf("creating the cache directory: %w", err)
	}
	c.removeStale()
	tmp, err := os.MkdirTemp(c.dir, ".extract-")
	if err != nil {
		return fmt.Errorf("creating the extraction directory: %w", err)
	}
	if err := extractImage(ctx, img, tmp, spec); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, c.entry(d, key)); err != nil {
		_ = os.RemoveAll(tmp)
		if c.has(d, key) {
			return nil // another worker on this node finished the same extraction first
		}
		return fmt.Errorf("moving the extracted image into the cache: %w", err)
	}
	return nil
}

// removeStale deletes extraction directories left behind by crashed runs. Recent ones may belong
// to a worker of another Module running now, so they stay.
func (c cache) removeStale() {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".extract-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > max(staleExtraction, c.staleAfter) {
			_ = os.RemoveAll(filepath.Join(c.dir, e.Name()))
		}
	}
}

// accessFile is the record that the identity id proved access to the digest d.
func (c cache) accessFile(d v1.Hash, id string) string {
	return filepath.Join(c.dir, "access", d.Hex, id)
}

// hasAccess reports whether id proved access to d.
func (c cache) hasAccess(d v1.Hash, id string) bool {
	_, err := os.Stat(c.accessFile(d, id))
	return err == nil
}

// recordAccess records that id proved access to d.
func (c cache) recordAccess(d v1.Hash, id string) error {
	file := c.accessFile(d, id)
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil {
		return err
	}
	return os.WriteFile(file, nil, 0o600)
}

// errNotProven is returned with imagePullPolicy Never when the image is cached but this Module's
// credentials never proved access to it.
var errNotProven = errors.New("the image is cached, but this Module's credentials have not proven access to it and imagePullPolicy is Never, which forbids asking the registry")

// errNotCached is returned with imagePullPolicy Never when the image is not in the cache.
var errNotCached = errors.New("the image is not in the cache and imagePullPolicy is Never")
