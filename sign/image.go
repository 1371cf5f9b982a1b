package sign

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kmm-project/kmm/registry"
)

// Bounds of Image (docs/sign.md).
const (
	// MaxPatterns bounds the entries of filesToSign.
	MaxPatterns = 64
	// DefaultMaxFiles bounds the files signed in one image.
	DefaultMaxFiles = 256
	// DefaultMaxImageBytes bounds the compressed bytes of the unsigned image's layers.
	DefaultMaxImageBytes int64 = 4 << 30
	// DefaultMaxTarBytes bounds the uncompressed bytes read from its layers.
	DefaultMaxTarBytes int64 = 8 << 30
	// DefaultMaxSignedBytes bounds the signed files held in memory for the new layer.
	DefaultMaxSignedBytes int64 = 1 << 30
)

// ImageLimits bound one Image; zero fields take the defaults above.
type ImageLimits struct {
	MaxFiles       int
	MaxImageBytes  int64
	MaxTarBytes    int64
	MaxSignedBytes int64
}

func (l ImageLimits) withDefaults() ImageLimits {
	if l.MaxFiles == 0 {
		l.MaxFiles = DefaultMaxFiles
	}
	if l.MaxImageBytes == 0 {
		l.MaxImageBytes = DefaultMaxImageBytes
	}
	if l.MaxTarBytes == 0 {
		l.MaxTarBytes = DefaultMaxTarBytes
	}
	if l.MaxSignedBytes == 0 {
		l.MaxSignedBytes = DefaultMaxSignedBytes
	}
	return l
}

// ImageOptions say what Image signs and where the images are.
type ImageOptions struct {
	// Source is the unsigned image (sign.unsignedImage, or the image a build pushed).
	Source string
	// SourceTLS are sign.unsignedImageRegistryTLS.
	SourceTLS registry.ModuleTLS
	// Target is the signed image's name (the kernel mapping's containerImage).
	Target string
	// TargetTLS are the kernel mapping's registryTLS.
	TargetTLS registry.ModuleTLS
	// FilesToSign are absolute paths in the image, or globs (*, ?, [...] and [!...] as the shell
	// reads them; no ** and no braces), each of which must match at least one file.
	FilesToSign []string
	// Registries and Trust are the registry configuration the worker pulls with (mirrors, CAs).
	Registries registry.Sources
	Trust      registry.Trust
	// Keychain gives the credentials, for the pull and for the push.
	Keychain authn.Keychain
	// Transport is the base HTTP transport (nil: go-containerregistry's default).
	Transport http.RoundTripper
	// Limits bound the run.
	Limits ImageLimits
}

// SignedFile is one file Image signed.
type SignedFile struct {
	// Path is the file's absolute path in the image.
	Path string
	// Resigned is true when the file was signed already and its signature was replaced.
	Resigned bool
}

// ImageResult is what Image did.
type ImageResult struct {
	// Digest is the pushed image's manifest digest.
	Digest v1.Hash
	// Files are the files signed, by path.
	Files []SignedFile
}

// Image pulls o.Source, signs every file that o.FilesToSign matches with s, writes the signed
// files as one new layer on top of the unsigned image's layers and pushes the result as o.Target.
// The unsigned image's layers are not rewritten: a push to the same registry mounts them.
func Image(ctx context.Context, s *Signer, o ImageOptions) (ImageResult, error) {
	o.Limits = o.Limits.withDefaults()
	patterns, err := compilePatterns(o.FilesToSign)
	if err != nil {
		return ImageResult{}, err
	}
	img, err := pull(ctx, o)
	if err != nil {
		return ImageResult{}, err
	}
	if err := checkImageSize(img, o.Limits.MaxImageBytes); err != nil {
		return ImageResult{}, err
	}
	entries, files, err := signLayers(img, s, patterns, o.Limits)
	if err != nil {
		return ImageResult{}, err
	}
	signed, err := appendLayer(img, entries)
	if err != nil {
		return ImageResult{}, err
	}
	d, err := push(ctx, o, signed)
	if err != nil {
		return ImageResult{}, err
	}
	return ImageResult{Digest: d, Files: files}, nil
}

// compilePatterns checks filesToSign and turns the shell's [!...] into path.Match's [^...].
func compilePatterns(in []string) ([]string, error) {
	if len(in) == 0 {
		return nil, errorf(ClassInvalidInput, "filesToSign is empty")
	}
	if len(in) > MaxPatterns {
		return nil, errorf(ClassTooLarge, "filesToSign has %d entries, more than %d", len(in), MaxPatterns)
	}
	out := make([]string, 0, len(in))
	for _, p := range in {
		if !strings.HasPrefix(p, "/") {
			return nil, errorf(ClassInvalidInput, "filesToSign entry %q is not an absolute path", p)
		}
		q := path.Clean(strings.ReplaceAll(p, "[!", "[^"))
		if _, err := path.Match(q, ""); err != nil {
			return nil, errorf(ClassInvalidInput, "filesToSign entry %q: %w", p, err)
		}
		out = append(out, q)
	}
	return out, nil
}

// pull gets the image for the sign pod's platform from the first endpoint of the registry
// configuration (mirrors, then the origin) that serves it.
func pull(ctx context.Context, o ImageOptions) (v1.Image, error) {
	ref, err := name.ParseReference(o.Source, refOpts(o.SourceTLS)...)
	if err != nil {
		return nil, errorf(ClassInvalidInput, "unsigned image %q: %w", o.Source, err)
	}
	eps, err := registry.PlanFor(o.Registries, ref, o.SourceTLS)
	if err != nil {
		return nil, errorf(ClassPull, "pulling %s: %w", o.Source, err)
	}
	var fails []string
	for _, ep := range eps {
		img, err := pullFrom(ctx, o, ep, ref)
		if err == nil {
			return img, nil
		}
		fails = append(fails, fmt.Sprintf("%s: %v", ep, err))
	}
	return nil, errorf(ClassPull, "pulling %s: %s", o.Source, strings.Join(fails, "; "))
}

func pullFrom(ctx context.Context, o ImageOptions, ep registry.Endpoint, ref name.Reference) (v1.Image, error) {
	epRef, err := ep.Reference(ref)
	if err != nil {
		return nil, err
	}
	opts, err := ep.RemoteOptions(o.Transport, o.Trust, keychain(o), remote.WithContext(ctx),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}), remote.WithUserAgent("kmm-worker-sign"))
	if err != nil {
		return nil, err
	}
	return remote.Image(epRef, opts...)
}

// push writes img to the target's origin (mirrors serve pulls only), with the TLS settings the
// registry configuration and the Module give it.
func push(ctx context.Context, o ImageOptions, img v1.Image) (v1.Hash, error) {
	ref, err := name.ParseReference(o.Target, refOpts(o.TargetTLS)...)
	if err != nil {
		return v1.Hash{}, errorf(ClassInvalidInput, "image %q: %w", o.Target, err)
	}
	eps, err := registry.PlanFor(o.Registries, ref, o.TargetTLS)
	if err != nil {
		return v1.Hash{}, errorf(ClassPush, "pushing %s: %w", o.Target, err)
	}
	ep := eps[len(eps)-1] // the plan ends with the origin (or the hosts.toml server standing for it)
	epRef, err := ep.Reference(ref)
	if err == nil {
		var opts []remote.Option
		if opts, err = ep.RemoteOptions(o.Transport, o.Trust, keychain(o), remote.WithContext(ctx), remote.WithUserAgent("kmm-worker-sign")); err == nil {
			err = remote.Write(epRef, img, opts...)
		}
	}
	if err != nil {
		return v1.Hash{}, errorf(ClassPush, "pushing %s to %s: %w", o.Target, ep, err)
	}
	d, err := img.Digest()
	return d, classify(ClassPush, err)
}

func refOpts(tls registry.ModuleTLS) []name.Option {
	if tls.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

func keychain(o ImageOptions) authn.Keychain {
	if o.Keychain == nil {
		return authn.NewMultiKeychain()
	}
	return o.Keychain
}

// checkImageSize refuses an image whose layers, as the manifest declares them, exceed max bytes.
func checkImageSize(img v1.Image, maxBytes int64) error {
	m, err := img.Manifest()
	if err != nil {
		return errorf(ClassPull, "reading the manifest: %w", err)
	}
	var total int64
	for _, l := range m.Layers {
		total += l.Size
	}
	if total > maxBytes {
		return errorf(ClassTooLarge, "the unsigned image's layers are %d bytes, more than %d", total, maxBytes)
	}
	return nil
}

// signedEntry is a file of the new layer.
type signedEntry struct {
	hdr  tar.Header
	data []byte
}

// signLayers reads the image's file system as its layers make it (whiteouts applied) and signs
// every regular file a pattern matches; every pattern must match one at least.
func signLayers(img v1.Image, s *Signer, patterns []string, lim ImageLimits) ([]signedEntry, []SignedFile, error) {
	rc := mutate.Extract(img)
	defer rc.Close() //nolint:errcheck // read-only
	tr := tar.NewReader(&limitReader{r: rc, left: lim.MaxTarBytes})
	matched := make([]int, len(patterns))
	var entries []signedEntry
	var files []SignedFile
	var held int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, classify(ClassPull, fmt.Errorf("reading the image's layers: %w", err))
		}
		p := "/" + strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if !matchAny(patterns, p, matched) || hdr.Typeflag == tar.TypeDir {
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil, nil, errorf(ClassNotModule, "%s matches filesToSign but is not a regular file (tar type %q): list the file it stands for", p, hdr.Typeflag)
		}
		if len(files) == lim.MaxFiles {
			return nil, nil, errorf(ClassTooLarge, "filesToSign matches more than %d files", lim.MaxFiles)
		}
		if held += hdr.Size; hdr.Size > s.opts.MaxModuleBytes || held > lim.MaxSignedBytes {
			return nil, nil, errorf(ClassTooLarge, "%s: %d bytes (module bound %d, all signed files %d)", p, hdr.Size, s.opts.MaxModuleBytes, lim.MaxSignedBytes)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, classify(ClassPull, fmt.Errorf("reading %s: %w", p, err))
		}
		out, resigned, err := s.SignModule(data)
		if err != nil {
			return nil, nil, &Error{Class: ClassOf(err), Err: fmt.Errorf("%s: %w", p, err)}
		}
		h := *hdr
		h.Size = int64(len(out))
		entries = append(entries, signedEntry{hdr: h, data: out})
		files = append(files, SignedFile{Path: p, Resigned: resigned})
	}
	slices.SortFunc(entries, func(a, b signedEntry) int { return strings.Compare(a.hdr.Name, b.hdr.Name) })
	slices.SortFunc(files, func(a, b SignedFile) int { return strings.Compare(a.Path, b.Path) })
	for i, n := range matched {
		if n == 0 {
			return nil, nil, errorf(ClassNoMatch, "filesToSign entry %q matches no file of the image", patterns[i])
		}
	}
	return entries, files, nil
}

// matchAny says whether p matches a pattern and counts the matches of each.
func matchAny(patterns []string, p string, matched []int) bool {
	hit := false
	for i, pat := range patterns {
		if ok, _ := path.Match(pat, p); ok {
			matched[i]++
			hit = true
		}
	}
	return hit
}

// appendLayer adds the signed files as one layer (gzip, reproducible: the files keep their
// archive headers) on top of img.
func appendLayer(img v1.Image, entries []signedEntry) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, classify(ClassPush, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, classify(ClassPush, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, classify(ClassPush, err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		return nil, classify(ClassPush, err)
	}
	out, err := mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{CreatedBy: fmt.Sprintf("kmm worker sign: %d files", len(entries))}})
	return out, classify(ClassPush, err)
}

// limitReader fails once more than left bytes were read.
type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if l.left -= int64(n); l.left < 0 {
		return n, errorf(ClassTooLarge, "the unsigned image's layers hold more than the bound of uncompressed bytes")
	}
	return n, err
}
