package worker

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kmm-project/kmm/contract"
)

// extractSpec says what to extract from an image and what must be there.
type extractSpec struct {
	Filter filter
	// KernelDir must exist as a directory after extraction.
	KernelDir string
	// FirmwareDir, when set, must exist as a directory after extraction.
	FirmwareDir string
	// MaxBytes caps the file bytes written.
	MaxBytes int64
	// Limits bound the rest of the work (with their defaults filled in).
	Limits Limits
}

// extractor applies the layers of one image, in order, to an extraction root.
type extractor struct {
	root    *os.Root
	spec    extractSpec
	written int64
	layer   int
	// compressed and uncompressed count the bytes read from all layers so far.
	compressed, uncompressed int64
	// examined and acted count the archive entries read and those acted on.
	examined, acted int
	// rootSteps counts the path components handed to root (see extractWork).
	rootSteps int
	// extracted records each written path and the layer that wrote it, for whiteouts and hard links.
	extracted pathIndex
	// kernels are the kernel directories seen under <dirName>/lib/modules, for error messages.
	kernels map[string]bool
	buf     []byte
}

// extractImage extracts the wanted subtrees of img into the directory dir.
func extractImage(ctx context.Context, img v1.Image, dir string, spec extractSpec) error {
	_, err := extractCounted(ctx, img, dir, spec)
	return err
}

// extractWork counts the work of one extraction, for the tests that check it grows linearly
// with the image: archive entries examined, path components handed to the extraction root (each
// costs a system call or two: os.Root resolves a path one component at a time) and nodes of the
// path index visited.
type extractWork struct {
	examined, rootSteps, indexVisits int
}

// extractCounted is extractImage, also returning the work it did.
func extractCounted(ctx context.Context, img v1.Image, dir string, spec extractSpec) (extractWork, error) {
	layers, err := img.Layers()
	if err != nil {
		return extractWork{}, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("reading the image's layers: %w", err)}
	}
	if len(layers) > spec.Limits.MaxLayers {
		return extractWork{}, overLimit("maxLayers", int64(spec.Limits.MaxLayers), "the image has %d layers", len(layers))
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return extractWork{}, err
	}
	defer root.Close() //nolint:errcheck // files are closed one by one
	x := &extractor{root: root, spec: spec, kernels: map[string]bool{}, buf: make([]byte, 1<<20)}
	err = x.extract(ctx, layers)
	return extractWork{examined: x.examined, rootSteps: x.rootSteps, indexVisits: x.extracted.visits}, err
}

func (x *extractor) extract(ctx context.Context, layers []v1.Layer) error {
	for i, l := range layers {
		x.layer = i
		if err := x.applyLayer(ctx, l); err != nil {
			return err
		}
	}
	if err := x.checkSymlinks(); err != nil {
		return err
	}
	return x.checkRequired()
}

// at returns p for an operation of the extraction root, counting its components.
func (x *extractor) at(p string) string {
	x.rootSteps += strings.Count(p, "/") + 1
	return p
}

// layerStream is the compressed stream of one layer as downloaded (go-containerregistry checks
// its size and digest when it reaches the end). It counts the bytes against the image's cap and
// remembers the first download or verification error, to tell a wrong download from a malformed
// or refused archive.
type layerStream struct {
	rc     io.ReadCloser
	digest v1.Hash
	count  *int64
	max    int64
	err    error
}

func (s *layerStream) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.rc.Read(p)
	*s.count += int64(n)
	switch {
	case err != nil && err != io.EOF:
		s.err = err
	case *s.count > s.max:
		s.err = overLimit("maxImageBytes", s.max, "the layers are more than %d compressed bytes", s.max)
		err = s.err
	}
	return n, err
}

// Close implements io.Closer.
func (s *layerStream) Close() error { return s.rc.Close() }

// verify reads the rest of the stream, so that go-containerregistry compares the download with
// the layer's digest, and returns the download or verification error, if any.
func (s *layerStream) verify(buf []byte) error {
	if s.err == nil {
		_, _ = io.CopyBuffer(io.Discard, s, buf)
	}
	var le *limitError
	if errors.As(s.err, &le) {
		return nil
	}
	return s.err
}

// streamedLayer is a layer whose compressed stream is a layerStream; go-containerregistry still
// detects the compression and decompresses it.
type streamedLayer struct {
	l      v1.Layer
	stream *layerStream
	x      *extractor
}

func (s *streamedLayer) Digest() (v1.Hash, error)            { return s.l.Digest() }
func (s *streamedLayer) Size() (int64, error)                { return s.l.Size() }
func (s *streamedLayer) MediaType() (types.MediaType, error) { return s.l.MediaType() }

// Compressed opens the layer's download as a layerStream.
func (s *streamedLayer) Compressed() (io.ReadCloser, error) {
	d, err := s.l.Digest()
	if err != nil {
		return nil, err
	}
	rc, err := s.l.Compressed()
	if err != nil {
		return nil, err
	}
	s.stream = &layerStream{rc: rc, digest: d, count: &s.x.compressed, max: s.x.spec.Limits.MaxImageBytes}
	return s.stream, nil
}

// countingReader fails once more than max bytes were read through it (counted in *count).
type countingReader struct {
	r     io.Reader
	count *int64
	max   int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if *c.count += int64(n); *c.count > c.max {
		return n, overLimit("maxTarBytes", c.max, "the layers hold more than %d uncompressed bytes", c.max)
	}
	return n, err
}

func (x *extractor) applyLayer(ctx context.Context, l v1.Layer) error {
	sl := &streamedLayer{l: l, x: x}
	ul, err := partial.CompressedToLayer(sl)
	if err != nil {
		return &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("layer %d: %w", x.layer, err)}
	}
	rc, err := ul.Uncompressed()
	if err != nil {
		return x.layerError(sl.stream, fmt.Errorf("downloading: %w", err))
	}
	defer rc.Close() //nolint:errcheck // read-only stream; verification errors surface on Read
	if err := x.readArchive(ctx, &countingReader{r: rc, count: &x.uncompressed, max: x.spec.Limits.MaxTarBytes}); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return x.layerError(sl.stream, err)
	}
	return nil
}

// readArchive applies the entries of one layer's archive, then reads to its end so that the
// download is verified.
func (x *extractor) readArchive(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if x.examined++; x.examined > x.spec.Limits.MaxEntries {
			return overLimit("maxEntries", int64(x.spec.Limits.MaxEntries), "the layers have more than %d archive entries", x.spec.Limits.MaxEntries)
		}
		if err := x.apply(tr, hdr); err != nil {
			return classified(contract.ReasonOther, err)
		}
	}
	_, err := io.CopyBuffer(io.Discard, r, x.buf)
	return err
}

// layerError classifies the failure of a layer: a download that failed or does not match the
// layer's digest is ImagePull whatever the archive held; an archive refused by a check is Other, as
// is one that is not a tar archive.
func (x *extractor) layerError(s *layerStream, err error) error {
	if s != nil {
		if verr := s.verify(x.buf); verr != nil {
			return &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("layer %d (%s): the download failed or does not match its digest: %w", x.layer, s.digest, verr)}
		}
	}
	var we *Error
	if errors.As(err, &we) {
		return &Error{Reason: we.Reason, Err: fmt.Errorf("layer %d: %w", x.layer, err)}
	}
	return &Error{Reason: contract.ReasonOther, Err: fmt.Errorf("layer %d is not a valid tar archive: %w", x.layer, err)}
}

// apply carries out the plan for one entry.
func (x *extractor) apply(r io.Reader, hdr *tar.Header) error {
	x.noteKernel(hdr.Name)
	plan, err := planEntry(hdr, x.spec.Filter)
	if err != nil || plan.Action == skipEntry {
		return err
	}
	if x.acted++; x.acted > x.spec.Limits.MaxExtractEntries {
		return overLimit("maxExtractEntries", int64(x.spec.Limits.MaxExtractEntries), "the layers have more than %d entries in the extracted directories", x.spec.Limits.MaxExtractEntries)
	}
	if err := x.checkPaths(hdr.Name, plan); err != nil {
		return err
	}
	switch plan.Action {
	case mkdirEntry:
		err = x.mkdir(plan.Path)
	case fileEntry:
		err = x.writeFile(r, hdr, plan.Path)
	case symlinkEntry, hostLinkEntry:
		err = x.symlink(plan)
	case hardlinkEntry:
		err = x.hardlink(plan)
	case whiteoutEntry, opaqueEntry:
		return x.whiteout(plan)
	default:
		return nil
	}
	if err != nil {
		return fmt.Errorf("extracting %q: %w", hdr.Name, err)
	}
	x.extracted.put(plan.Path, extracted{layer: x.layer, kind: plan.Action})
	return nil
}

// checkPaths refuses an entry whose path or link target is longer or deeper than the limits.
func (x *extractor) checkPaths(name string, plan entryPlan) error {
	l := x.spec.Limits
	for _, c := range [...]struct{ what, p string }{{"path", plan.Path}, {"link target", plan.Target}} {
		what, p := c.what, c.p
		if len(p) > l.MaxPathBytes {
			return overLimit("maxPathBytes", int64(l.MaxPathBytes), "archive entry %q has a %s of %d bytes", shortName(name), what, len(p))
		}
		if depth := strings.Count(p, "/") + 1; depth > l.MaxPathDepth {
			return overLimit("maxPathDepth", int64(l.MaxPathDepth), "archive entry %q has a %s %d components deep", shortName(name), what, depth)
		}
	}
	return nil
}

// shortName is the start of a long archive path, for messages.
func shortName(name string) string {
	const keep = 120
	if len(name) <= keep {
		return name
	}
	return name[:keep] + "…"
}

// noteKernel records the kernel directory an entry name is in, if any.
func (x *extractor) noteKernel(name string) {
	modules := path.Dir(x.spec.KernelDir) + "/"
	p := strings.TrimPrefix(path.Clean(name), "./")
	if rest, ok := strings.CutPrefix(p, modules); ok && len(x.kernels) < 32 {
		x.kernels[strings.SplitN(rest, "/", 2)[0]] = true
	}
}

// clear removes what is at p unless it is a directory and keepDir is set.
func (x *extractor) clear(p string, keepDir bool) error {
	st, err := x.root.Lstat(x.at(p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		if keepDir {
			return nil
		}
		return x.root.RemoveAll(x.at(p))
	}
	return x.root.Remove(x.at(p))
}

func (x *extractor) mkdir(p string) error {
	if err := x.clear(p, true); err != nil {
		return err
	}
	return x.root.MkdirAll(x.at(p), 0o755)
}

func (x *extractor) writeFile(r io.Reader, hdr *tar.Header, p string) error {
	if hdr.Size > x.spec.MaxBytes-x.written {
		return fmt.Errorf("%d bytes would exceed the extraction size cap of %d bytes (worker limit maxExtractBytes; %d already written)", hdr.Size, x.spec.MaxBytes, x.written)
	}
	if err := x.root.MkdirAll(x.at(path.Dir(p)), 0o755); err != nil {
		return err
	}
	if err := x.clear(p, false); err != nil {
		return err
	}
	perm := fs.FileMode(hdr.Mode)&0o755 | 0o644 // #nosec G115 -- only the permission bits are kept
	f, err := x.root.OpenFile(x.at(p), os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	n, err := io.CopyBuffer(f, io.LimitReader(r, hdr.Size), x.buf)
	x.written += n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// symlink creates a link of the image. The host link's target is absolute and outside the root:
// the root refuses to write, create or resolve anything through it, so nothing is written to the
// node's module tree.
func (x *extractor) symlink(plan entryPlan) error {
	if err := x.root.MkdirAll(x.at(path.Dir(plan.Path)), 0o755); err != nil {
		return err
	}
	if err := x.clear(plan.Path, false); err != nil {
		return err
	}
	return x.root.Symlink(plan.Target, x.at(plan.Path))
}

func (x *extractor) hardlink(plan entryPlan) error {
	if e, ok := x.extracted.get(plan.Target); !ok || e.kind != fileEntry {
		return fmt.Errorf("hard link to %q, which is not a regular file extracted before it", plan.Target)
	}
	if err := x.root.MkdirAll(x.at(path.Dir(plan.Path)), 0o755); err != nil {
		return err
	}
	if err := x.clear(plan.Path, false); err != nil {
		return err
	}
	return x.root.Link(x.at(plan.Target), x.at(plan.Path))
}

// whiteout removes what lower layers extracted at (whiteout) or below (opaque) plan.Path. Files of
// the current layer stay, as the OCI layer format requires; directories stay (they may hold them).
func (x *extractor) whiteout(plan entryPlan) error {
	err := x.extracted.wipe(plan.Path, plan.Action == whiteoutEntry, x.layer, func(p string) error { return x.clear(p, true) })
	if err != nil {
		return fmt.Errorf("applying whiteout for %q: %w", plan.Path, err)
	}
	return nil
}

// checkSymlinks refuses symlinks that resolve outside the extraction root through other links.
func (x *extractor) checkSymlinks() error {
	return x.extracted.walk(func(p string, e extracted) error {
		if e.kind != symlinkEntry {
			return nil
		}
		if _, err := x.root.Stat(x.at(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &Error{Reason: contract.ReasonOther, Err: &unsafeEntryError{Name: p, Why: fmt.Sprintf("symlink does not resolve inside the extraction root: %v", err)}}
		}
		return nil
	})
}

// checkRequired reports a missing kernel or firmware directory.
func (x *extractor) checkRequired() error {
	if st, err := x.root.Stat(x.spec.KernelDir); err != nil || !st.IsDir() {
		return &Error{Reason: contract.ReasonNotFound, Err: fmt.Errorf("the image has no directory /%s for kernel %s (kernel directories in the image: %s)",
			x.spec.KernelDir, path.Base(x.spec.KernelDir), x.kernelList())}
	}
	if d := x.spec.FirmwareDir; d != "" {
		if st, err := x.root.Stat(d); err != nil || !st.IsDir() {
			return &Error{Reason: contract.ReasonNotFound, Err: fmt.Errorf("the image has no firmware directory /%s (modprobe.firmwarePath)", d)}
		}
	}
	return nil
}

func (x *extractor) kernelList() string {
	if len(x.kernels) == 0 {
		return "none"
	}
	names := make([]string, 0, len(x.kernels))
	for k := range x.kernels {
		names = append(names, k)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
