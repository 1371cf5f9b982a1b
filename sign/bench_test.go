package sign

import (
	"context"
	"crypto"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// countingHandler counts the body bytes the registry receives (up) and sends (down).
type countingHandler struct {
	h        http.Handler
	up, down atomic.Int64
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r.Body = countingBody{ReadCloser: r.Body, n: &c.up}
	c.h.ServeHTTP(countingWriter{ResponseWriter: w, n: &c.down}, r)
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	return n, err
}

// benchImage is a 100 MiB image: four layers of 24 MiB of incompressible data and a layer of
// four 1 MiB modules, the files filesToSign names.
func benchImage(b *testing.B) v1.Image {
	b.Helper()
	var layers []v1.Layer
	for i := range 4 {
		data := make([]byte, 24<<20)
		if _, err := rand.Read(data); err != nil {
			b.Fatal(err)
		}
		layers = append(layers, layerOf(b, tarFile{name: fmt.Sprintf("opt/data/blob%d", i), data: data}))
	}
	var mods []tarFile
	for i := range 4 {
		mods = append(mods, tarFile{name: fmt.Sprintf("%skmod%d.ko", modDir, i), data: fakeModule(b, fmt.Sprintf("kmod%d", i), 1<<20)})
	}
	img, err := mutate.AppendLayers(empty.Image, append(layers, layerOf(b, mods...))...)
	if err != nil {
		b.Fatal(err)
	}
	return img
}

// BenchmarkSign100MiB compares, on in-process registries, the sign of a 100 MiB image (pull every
// layer, sign the four modules, push one new layer) with a plain pull (every layer downloaded) and
// push of it, each with the target in the source's registry (where the layers exist already, as
// with upstream's <image>:<tag>-<ns>_<module>_kmm_unsigned) and in another registry (every layer
// uploaded). down and up count the body bytes both registries sent and received. docs/sign.md
// has the figures.
func BenchmarkSign100MiB(b *testing.B) {
	src := &countingHandler{h: ggcrregistry.New(ggcrregistry.Logger(nopLogger()))}
	srcSrv := httptest.NewServer(src)
	defer srcSrv.Close()
	srcHost := strings.TrimPrefix(srcSrv.URL, "http://")
	pushImage(b, srcHost+"/kmod/unsigned:v1", benchImage(b))
	ref, err := name.ParseReference(srcHost + "/kmod/unsigned:v1")
	if err != nil {
		b.Fatal(err)
	}
	signer := rsaPair(b).signer(b, crypto.SHA256)
	runs := map[string]func(target string) error{
		"sign": func(target string) error {
			_, err := Image(context.Background(), signer, ImageOptions{Source: ref.String(), Target: target, FilesToSign: []string{"/" + modDir + "*.ko"}})
			return err
		},
		"pull-push": func(target string) error { return pullPush(ref, target) },
	}
	for _, where := range []string{"same-registry", "other-registry"} {
		for _, op := range []string{"sign", "pull-push"} {
			b.Run(op+"/"+where, func(b *testing.B) {
				src.up.Store(0)
				src.down.Store(0)
				var up, down int64
				for i := range b.N {
					// The in-process registry keeps one blob store for all its repositories: a fresh
					// one per push, or every push after the first would find the layers there.
					dst := &countingHandler{h: ggcrregistry.New(ggcrregistry.Logger(nopLogger()))}
					dstSrv := httptest.NewServer(dst)
					host := strings.TrimPrefix(dstSrv.URL, "http://")
					if where == "same-registry" {
						host = srcHost
					}
					err := runs[op](fmt.Sprintf("%s/kmod/%s-%d:v1", host, op, i))
					dstSrv.Close()
					if err != nil {
						b.Fatal(err)
					}
					up, down = up+dst.up.Load(), down+dst.down.Load()
				}
				b.ReportMetric(float64(src.down.Load()+down)/float64(b.N)/(1<<20), "MiB-down/op")
				b.ReportMetric(float64(src.up.Load()+up)/float64(b.N)/(1<<20), "MiB-up/op")
			})
		}
	}
}

// pullPush downloads every layer of src, as a pull does, and pushes the image to dst.
func pullPush(src name.Reference, dst string) error {
	img, err := remote.Image(src)
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, rc)
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	ref, err := name.ParseReference(dst)
	if err != nil {
		return err
	}
	return remote.Write(ref, img)
}
