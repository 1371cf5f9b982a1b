package worker

import (
	"fmt"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kmm-project/kmm/contract"
)

// The default limits of one worker run (docs/worker-limits.md lists them with what happens when
// one is exceeded). A kmod image holds a few modules and maybe firmware: each default leaves a wide
// margin over such an image and still bounds what a hostile image can make the worker do. The
// default deadline of a whole run, contract.DefaultTimeout, is part of the contract with the operator.
const (
	// DefaultMaxExtractBytes caps the bytes of file content written into the cache for one image.
	DefaultMaxExtractBytes int64 = 256 << 20
	// DefaultMaxImageBytes caps the compressed bytes of an image's layers (as the manifest declares
	// them and as read).
	DefaultMaxImageBytes int64 = 512 << 20
	// DefaultMaxTarBytes caps the uncompressed archive bytes read from all layers, including the
	// content of entries that are skipped (a decompression bomb outside the wanted directories).
	DefaultMaxTarBytes int64 = 1 << 30
	// DefaultMaxLayers caps the layers of an image.
	DefaultMaxLayers = 128
	// DefaultMaxEntries caps the archive entries examined across all layers, skipped ones included.
	DefaultMaxEntries = 100_000
	// DefaultMaxExtractEntries caps the entries acted on (files, directories, links and whiteouts
	// inside the wanted directories) across all layers.
	DefaultMaxExtractEntries = 10_000
	// DefaultMaxManifestBytes caps an image manifest, an index and an image config.
	DefaultMaxManifestBytes int64 = 4 << 20
	// DefaultMaxPathDepth caps the path components of an entry acted on (and of a link's target):
	// the extraction root resolves a path one component at a time, so each entry costs at most
	// this many steps. A kernel module sits about 12 components deep.
	DefaultMaxPathDepth = 64
	// DefaultMaxPathBytes caps the length of an entry's path acted on (and of a link's target):
	// PATH_MAX, which modprobe and the kernel do not go past either.
	DefaultMaxPathBytes = 4096
)

// Limits bound the work one run does on an image; a zero field means its default.
type Limits struct {
	// MaxImageBytes caps the compressed layer bytes (DefaultMaxImageBytes).
	MaxImageBytes int64
	// MaxTarBytes caps the uncompressed archive bytes read (DefaultMaxTarBytes).
	MaxTarBytes int64
	// MaxLayers caps the number of layers (DefaultMaxLayers).
	MaxLayers int
	// MaxEntries caps the archive entries examined (DefaultMaxEntries).
	MaxEntries int
	// MaxExtractEntries caps the archive entries acted on (DefaultMaxExtractEntries).
	MaxExtractEntries int
	// MaxManifestBytes caps a manifest, an index or a config (DefaultMaxManifestBytes).
	MaxManifestBytes int64
	// MaxPathDepth caps the components of a path acted on (DefaultMaxPathDepth).
	MaxPathDepth int
	// MaxPathBytes caps the bytes of a path acted on (DefaultMaxPathBytes).
	MaxPathBytes int
}

// withDefaults fills the zero fields of l.
func (l Limits) withDefaults() Limits {
	orDefault(&l.MaxImageBytes, DefaultMaxImageBytes)
	orDefault(&l.MaxTarBytes, DefaultMaxTarBytes)
	orDefault(&l.MaxLayers, DefaultMaxLayers)
	orDefault(&l.MaxEntries, DefaultMaxEntries)
	orDefault(&l.MaxExtractEntries, DefaultMaxExtractEntries)
	orDefault(&l.MaxManifestBytes, DefaultMaxManifestBytes)
	orDefault(&l.MaxPathDepth, DefaultMaxPathDepth)
	orDefault(&l.MaxPathBytes, DefaultMaxPathBytes)
	return l
}

// orDefault sets *v to d when it is not positive (unset).
func orDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// limitError is a limit an image exceeded. It is classified contract.ReasonOther: the same image fails
// the same way until it changes.
type limitError struct {
	// What exceeded the limit, e.g. "the image has 5000 layers".
	What string
	// Limit names the limit and Value is its value.
	Limit string
	Value int64
}

func (e *limitError) Error() string {
	return fmt.Sprintf("%s, over the worker limit %s of %d", e.What, e.Limit, e.Value)
}

// overLimit returns a classified limit error.
func overLimit(limit string, value int64, format string, args ...any) error {
	return &Error{Reason: contract.ReasonOther, Err: &limitError{What: fmt.Sprintf(format, args...), Limit: limit, Value: value}}
}

// checkManifest checks what the manifest declares against the limits before any layer is read.
func checkManifest(m *v1.Manifest, l Limits) error {
	if n := len(m.Layers); n > l.MaxLayers {
		return overLimit("maxLayers", int64(l.MaxLayers), "the image has %d layers", n)
	}
	if m.Config.Size > l.MaxManifestBytes {
		return overLimit("maxManifestBytes", l.MaxManifestBytes, "the image config is %d bytes", m.Config.Size)
	}
	var total int64
	for i, d := range m.Layers {
		if d.Size < 0 || d.Size > l.MaxImageBytes-total {
			return overLimit("maxImageBytes", l.MaxImageBytes, "layers 0 to %d declare %d compressed bytes", i, total+d.Size)
		}
		total += d.Size
	}
	return nil
}

// checkImage checks the manifest of img against the limits.
func checkImage(img v1.Image, l Limits) error {
	m, err := img.Manifest()
	if err != nil {
		return &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("reading the image manifest: %w", err)}
	}
	return checkManifest(m, l)
}
