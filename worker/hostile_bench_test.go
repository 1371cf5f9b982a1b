package worker

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// hostileCase is an image built to make the worker work hard.
type hostileCase struct {
	name  string
	build func(b *testing.B) v1.Image
	// ok says the image is within the limits (the reference, and whiteouts that are only slow
	// without the path index).
	ok bool
}

var hostileCases = []hostileCase{
	{"normal-small", func(b *testing.B) v1.Image { return image(b, kmodEntries(b, "opt")) }, true},
	{"whiteouts-4900", func(b *testing.B) v1.Image {
		kd := "opt/lib/modules/" + testKernel + "/w/"
		var files, whiteouts []entry
		for i := range 4900 {
			files = append(files, file(fmt.Sprintf("%sf%05d", kd, i), "x"))
			whiteouts = append(whiteouts, file(fmt.Sprintf("%s.wh.f%05d", kd, i), ""))
		}
		return image(b, append(kmodEntries(b, "opt"), files...), whiteouts)
	}, true},
	{"layers-1000", func(b *testing.B) v1.Image {
		layers := [][]entry{kmodEntries(b, "opt")}
		for i := range 999 {
			layers = append(layers, []entry{file(fmt.Sprintf("opt/l%04d", i), "x")})
		}
		return image(b, layers...)
	}, false},
	{"files-100000", func(b *testing.B) v1.Image {
		kd := "opt/lib/modules/" + testKernel + "/many/"
		es := kmodEntries(b, "opt")
		for i := range 100_000 {
			es = append(es, file(fmt.Sprintf("%sf%06d", kd, i), "x"))
		}
		return image(b, es)
	}, false},
	{"manifest-99MiB", func(b *testing.B) v1.Image {
		return mutate.Annotations(image(b, kmodEntries(b, "opt")), map[string]string{"padding": strings.Repeat("p", 99<<20)}).(v1.Image)
	}, false},
	{"zipbomb-one-1GiB-file", func(b *testing.B) v1.Image {
		return withZeroLayer(b, []zeroFile{{"opt/lib/modules/" + testKernel + "/bomb.ko", 1 << 30}})
	}, false},
	{"zipbomb-8x128MiB-files", func(b *testing.B) v1.Image {
		var fs []zeroFile
		for i := range 8 {
			fs = append(fs, zeroFile{fmt.Sprintf("opt/lib/modules/%s/bomb%d.ko", testKernel, i), 128 << 20})
		}
		return withZeroLayer(b, fs)
	}, false},
	{"zipbomb-4GiB-skipped", func(b *testing.B) v1.Image {
		return withZeroLayer(b, []zeroFile{{"usr/share/bomb", 4 << 30}})
	}, false},
}

type zeroFile struct {
	name string
	size int64
}

// withZeroLayer is the test kmod image plus one layer of files full of zeros. The layer is a
// multi-member gzip stream that repeats one compressed MiB of zeros, so that building it is quick.
func withZeroLayer(b *testing.B, files []zeroFile) v1.Image {
	b.Helper()
	mib := gzipped(b, make([]byte, 1<<20))
	var data []byte
	for _, f := range files {
		var hdr bytes.Buffer
		if err := tar.NewWriter(&hdr).WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: f.size}); err != nil {
			b.Fatal(err)
		}
		data = append(data, gzipped(b, hdr.Bytes())...)
		for range f.size >> 20 {
			data = append(data, mib...)
		}
	}
	data = append(data, gzipped(b, make([]byte, 1024))...) // the end of the archive
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		b.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer(b, kmodEntries(b, "opt")), l)
	if err != nil {
		b.Fatal(err)
	}
	return img
}

func gzipped(b *testing.B, data []byte) []byte {
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := gz.Write(data); err != nil || gz.Close() != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

var (
	hostileOnce sync.Once
	hostileReg  *testRegistry
	hostileRefs = map[string]string{}
)

// BenchmarkHostileImages pulls and extracts each hostile image with the default limits into a
// fresh cache: each one must be cut by a limit in about the time of a small normal image, not run
// for minutes. "normal-small" is the reference.
func BenchmarkHostileImages(b *testing.B) {
	hostileOnce.Do(func() {
		hostileReg = startRegistry(registryOpts{})
		for _, c := range hostileCases {
			hostileRefs[c.name], _ = hostileReg.push(b, "kmod/"+strings.ToLower(c.name)+":v1", c.build(b))
		}
	})
	for _, c := range hostileCases {
		b.Run(c.name, func(b *testing.B) {
			var err error
			for range b.N {
				err = fetchFresh(b, hostileRefs[c.name])
			}
			if (err == nil) != c.ok {
				b.Errorf("%s: %v", c.name, err)
			}
			b.Logf("%s: %v", c.name, err)
		})
	}
}

// fetchFresh pulls and extracts ref into a fresh cache and returns the error.
func fetchFresh(b *testing.B, ref string) error {
	b.StopTimer()
	cacheDir, err := os.MkdirTemp(b.TempDir(), "cache-")
	if err != nil {
		b.Fatal(err)
	}
	w, err := New(Options{CacheDir: cacheDir, Modprobe: ModprobeFunc(nil), Host: NewSandboxHost(b.TempDir())})
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	_, err = w.fetch(context.Background(), "default", testConfig(ref).Config)
	b.StopTimer()
	_ = os.RemoveAll(cacheDir)
	b.StartTimer()
	return err
}
