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
)

// DefaultMaxExtractBytes caps the bytes of file content the worker writes for one image.
const DefaultMaxExtractBytes int64 = 1 << 30

// extractSpec says what to extract from an image and what must be there.
type extractSpec struct {
	Filter filter
	// KernelDir must exist as a directory after extraction.
	KernelDir string
	// FirmwareDir, when set, must exist as a directory after extraction.
	FirmwareDir string
	// MaxBytes caps the file bytes written.
	MaxBytes int64
}

// extractor applies the layers of one image, in order, to an extraction root.
type extractor struct {
	root    *os.Root
	spec    extractSpec
	written int64
	layer   int
	// extracted records each written path and the layer that wrote it, for whiteouts and hard links.
	extracted map[string]extracted
	// kernels are the kernel directories seen under <dirName>/lib/modules, for error messages.
	kernels map[string]bool
	buf     []byte
}

type extracted struct {
	layer int
	kind  entryAction
}

// extractImage extracts the wanted subtrees of img into the directory dir.
func extractImage(ctx context.Context, img v1.Image, dir string, spec extractSpec) error {
	layers, err := img.Layers()
	if err != nil {
		return &Error{Reason: ReasonImagePull, Err: fmt.Errorf("reading the image's layers: %w", err)}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close() //nolint:errcheck // files are closed one by one
	x := &extractor{root: root, spec: spec, extracted: map[string]extracted{}, kernels: map[string]bool{}, buf: make([]byte, 1<<20)}
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

// streamReader remembers the first error of the underlying stream, to tell a download failure
// from a malformed archive.
type streamReader struct {
	r   io.Reader
	err error
}

func (c *streamReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

func (x *extractor) applyLayer(ctx context.Context, l v1.Layer) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return &Error{Reason: ReasonImagePull, Err: fmt.Errorf("layer %d: downloading: %w", x.layer, err)}
	}
	defer rc.Close() //nolint:errcheck // read-only stream; verification errors surface on Read
	cr := &streamReader{r: rc}
	tr := tar.NewReader(cr)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.streamError(cr, err)
		}
		if err := x.apply(tr, hdr); err != nil {
			if cr.err != nil {
				return x.streamError(cr, err)
			}
			return classified(ReasonOther, fmt.Errorf("layer %d: %w", x.layer, err))
		}
	}
	// Read to the end so that the digest of the layer is verified.
	if _, err := io.CopyBuffer(io.Discard, cr, x.buf); err != nil {
		return x.streamError(cr, err)
	}
	return nil
}

func (x *extractor) streamError(cr *streamReader, err error) error {
	if cr.err != nil {
		return &Error{Reason: ReasonImagePull, Err: fmt.Errorf("layer %d: downloading: %w", x.layer, cr.err)}
	}
	return &Error{Reason: ReasonOther, Err: fmt.Errorf("layer %d is not a valid tar archive: %w", x.layer, err)}
}

// apply carries out the plan for one entry.
func (x *extractor) apply(r io.Reader, hdr *tar.Header) error {
	x.noteKernel(hdr.Name)
	plan, err := planEntry(hdr, x.spec.Filter)
	if err != nil {
		return err
	}
	switch plan.Action {
	case mkdirEntry:
		err = x.mkdir(plan.Path)
	case fileEntry:
		err = x.writeFile(r, hdr, plan.Path)
	case symlinkEntry:
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
	x.extracted[plan.Path] = extracted{layer: x.layer, kind: plan.Action}
	return nil
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
	st, err := x.root.Lstat(p)
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
		return x.root.RemoveAll(p)
	}
	return x.root.Remove(p)
}

func (x *extractor) mkdir(p string) error {
	if err := x.clear(p, true); err != nil {
		return err
	}
	return x.root.MkdirAll(p, 0o755)
}

func (x *extractor) writeFile(r io.Reader, hdr *tar.Header, p string) error {
	if hdr.Size > x.spec.MaxBytes-x.written {
		return fmt.Errorf("%d bytes would exceed the extraction size cap of %d bytes (%d already written)", hdr.Size, x.spec.MaxBytes, x.written)
	}
	if err := x.root.MkdirAll(path.Dir(p), 0o755); err != nil {
		return err
	}
	if err := x.clear(p, false); err != nil {
		return err
	}
	perm := fs.FileMode(hdr.Mode)&0o755 | 0o644 // #nosec G115 -- only the permission bits are kept
	f, err := x.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
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

func (x *extractor) symlink(plan entryPlan) error {
	if err := x.root.MkdirAll(path.Dir(plan.Path), 0o755); err != nil {
		return err
	}
	if err := x.clear(plan.Path, false); err != nil {
		return err
	}
	return x.root.Symlink(plan.Target, plan.Path)
}

func (x *extractor) hardlink(plan entryPlan) error {
	if e, ok := x.extracted[plan.Target]; !ok || e.kind != fileEntry {
		return fmt.Errorf("hard link to %q, which is not a regular file extracted before it", plan.Target)
	}
	if err := x.root.MkdirAll(path.Dir(plan.Path), 0o755); err != nil {
		return err
	}
	if err := x.clear(plan.Path, false); err != nil {
		return err
	}
	return x.root.Link(plan.Target, plan.Path)
}

// whiteout removes what lower layers extracted at (whiteout) or below (opaque) plan.Path. Files of
// the current layer stay, as the OCI layer format requires; directories stay (they may hold them).
func (x *extractor) whiteout(plan entryPlan) error {
	for p, e := range x.extracted {
		below := plan.Path == "." || strings.HasPrefix(p, plan.Path+"/")
		self := plan.Action == whiteoutEntry && p == plan.Path
		if e.layer >= x.layer || (!below && !self) || e.kind == mkdirEntry {
			continue
		}
		if err := x.clear(p, true); err != nil {
			return fmt.Errorf("applying whiteout for %q: %w", plan.Path, err)
		}
		delete(x.extracted, p)
	}
	return nil
}

// checkSymlinks refuses symlinks that resolve outside the extraction root through other links.
func (x *extractor) checkSymlinks() error {
	for p, e := range x.extracted {
		if e.kind != symlinkEntry {
			continue
		}
		if _, err := x.root.Stat(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return &Error{Reason: ReasonOther, Err: &unsafeEntryError{Name: p, Why: fmt.Sprintf("symlink does not resolve inside the extraction root: %v", err)}}
		}
	}
	return nil
}

// checkRequired reports a missing kernel or firmware directory.
func (x *extractor) checkRequired() error {
	if st, err := x.root.Stat(x.spec.KernelDir); err != nil || !st.IsDir() {
		return &Error{Reason: ReasonNotFound, Err: fmt.Errorf("the image has no directory /%s for kernel %s (kernel directories in the image: %s)",
			x.spec.KernelDir, path.Base(x.spec.KernelDir), x.kernelList())}
	}
	if d := x.spec.FirmwareDir; d != "" {
		if st, err := x.root.Stat(d); err != nil || !st.IsDir() {
			return &Error{Reason: ReasonNotFound, Err: fmt.Errorf("the image has no firmware directory /%s (modprobe.firmwarePath)", d)}
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
