package sign

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kmm-project/kmm/registry"
)

// tarFile is one archive entry of a test layer.
type tarFile struct {
	name, link string
	typ        byte
	data       []byte
}

func layerOf(t testing.TB, files ...tarFile) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		typ := f.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Linkname: f.link, Typeflag: typ, Mode: 0o644, Size: int64(len(f.data))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startRegistry serves an in-process registry and returns its host:port.
func startRegistry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(nopLogger())))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func pushImage(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

// files returns the regular files of img's file system by path.
func files(t testing.TB, img v1.Image) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out["/"+strings.TrimPrefix(hdr.Name, "/")] = data
		}
	}
}

const modDir = "opt/lib/modules/6.1.0-test/extra/"

// TestSignImage signs the modules of a two-layer image (the upper layer replaces one module and
// brings a signed one) and checks the pushed image: every matched module verifies against the
// certificate and is the newest version, the other files and the base layers are unchanged.
func TestSignImage(t *testing.T) {
	kp := rsaPair(t)
	host := startRegistry(t)
	a, b1, b2, c := fakeModule(t, "a", 300), fakeModule(t, "b-old", 300), fakeModule(t, "b", 300), fakeModule(t, "c", 300)
	cSigned, _, err := ecdsaPair(t, nil2P256()).signer(t, crypto.SHA256).SignModule(c)
	if err != nil {
		t.Fatal(err)
	}
	base := layerOf(t, tarFile{name: "opt/", typ: tar.TypeDir}, tarFile{name: modDir + "a.ko", data: a}, tarFile{name: modDir + "b.ko", data: b1},
		tarFile{name: "opt/README", data: []byte("not a module")}, tarFile{name: modDir + "notes.txt", data: []byte("x")})
	upper := layerOf(t, tarFile{name: modDir + "b.ko", data: b2}, tarFile{name: modDir + "c.ko", data: cSigned})
	unsigned, err := mutate.AppendLayers(empty.Image, base, upper)
	if err != nil {
		t.Fatal(err)
	}
	pushImage(t, host+"/kmod/unsigned:v1", unsigned)

	res, err := Image(context.Background(), kp.signer(t, crypto.SHA256), ImageOptions{
		Source: host + "/kmod/unsigned:v1", Target: host + "/kmod/signed:v1",
		FilesToSign: []string{"/" + modDir + "*.ko", "/" + modDir + "[!x]?ko"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []SignedFile{{Path: "/" + modDir + "a.ko"}, {Path: "/" + modDir + "b.ko"}, {Path: "/" + modDir + "c.ko", Resigned: true}}
	if len(res.Files) != len(want) {
		t.Fatalf("signed %+v, want %+v", res.Files, want)
	}
	for i := range want {
		if res.Files[i] != want[i] {
			t.Errorf("file %d: %+v, want %+v", i, res.Files[i], want[i])
		}
	}
	ref, _ := name.ParseReference(host + "/kmod/signed:v1")
	signed, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := signed.Digest(); d != res.Digest {
		t.Errorf("pushed digest %s, result says %s", d, res.Digest)
	}
	checkSignedImage(t, unsigned, signed, kp, map[string][]byte{"a.ko": a, "b.ko": b2, "c.ko": c})
}

func checkSignedImage(t *testing.T, unsigned, signed v1.Image, kp keyPair, modules map[string][]byte) {
	t.Helper()
	got := files(t, signed)
	for f, mod := range modules {
		m, err := verifySigned(got["/"+modDir+f], kp.cert, crypto.SHA256)
		if err != nil {
			t.Errorf("%s: %v", f, err)
		} else if !bytes.Equal(m, mod) {
			t.Errorf("%s: the signed file is not the image's newest module", f)
		}
	}
	if string(got["/opt/README"]) != "not a module" || string(got["/"+modDir+"notes.txt"]) != "x" {
		t.Error("files not matched by filesToSign changed")
	}
	before, _ := unsigned.Layers()
	after, _ := signed.Layers()
	if len(after) != len(before)+1 {
		t.Fatalf("%d layers, want the %d of the unsigned image and one more", len(after), len(before))
	}
	for i := range before {
		d1, _ := before[i].Digest()
		d2, _ := after[i].Digest()
		if d1 != d2 {
			t.Errorf("layer %d changed: %s → %s", i, d1, d2)
		}
	}
}

// TestSignImageThroughMirror: the unsigned image is pulled through the mirror the operator's
// registries.conf names (the origin does not exist), with the same settings as the worker.
func TestSignImageThroughMirror(t *testing.T) {
	kp := rsaPair(t)
	host := startRegistry(t)
	mod := fakeModule(t, "m", 100)
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, tarFile{name: modDir + "m.ko", data: mod}))
	if err != nil {
		t.Fatal(err)
	}
	pushImage(t, host+"/kmod/unsigned:v1", img)
	conf := filepath.Join(t.TempDir(), "registries.conf")
	data := "[[registry]]\nprefix = \"origin.invalid\"\nlocation = \"origin.invalid\"\n[[registry.mirror]]\nlocation = \"" + host + "\"\ninsecure = true\n"
	if err := os.WriteFile(conf, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	o := ImageOptions{Source: "origin.invalid/kmod/unsigned:v1", Target: host + "/kmod/signed:v1", FilesToSign: []string{"/" + modDir + "m.ko"}}
	if _, err := Image(context.Background(), kp.signer(t, crypto.SHA256), o); ClassOf(err) != ClassPull {
		t.Fatalf("without the mirror: %v, want a pull failure", err)
	}
	o.Registries = registry.Sources{OperatorRegistriesConf: []string{conf}}
	if _, err := Image(context.Background(), kp.signer(t, crypto.SHA256), o); err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/kmod/signed:v1")
	signed, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := verifySigned(files(t, signed)["/"+modDir+"m.ko"], kp.cert, crypto.SHA256); err != nil {
		t.Error(err)
	}
}

// TestSignImageRefusals: each failure has its class, and nothing is pushed.
func TestSignImageRefusals(t *testing.T) {
	kp := rsaPair(t)
	host := startRegistry(t)
	img, err := mutate.AppendLayers(empty.Image, layerOf(t,
		tarFile{name: modDir + "m.ko", data: fakeModule(t, "m", 100)},
		tarFile{name: modDir + "n.ko", data: fakeModule(t, "n", 100)},
		tarFile{name: modDir + "script.ko", data: []byte("#!/bin/sh\n")},
		tarFile{name: modDir + "link.ko", typ: tar.TypeSymlink, link: "m.ko"}))
	if err != nil {
		t.Fatal(err)
	}
	pushImage(t, host+"/kmod/unsigned:v1", img)
	cases := map[string]struct {
		o    ImageOptions
		want Class
	}{
		"no match":           {ImageOptions{FilesToSign: []string{"/" + modDir + "m.ko", "/opt/absent/*.ko"}}, ClassNoMatch},
		"not a module":       {ImageOptions{FilesToSign: []string{"/" + modDir + "s*.ko"}}, ClassNotModule},
		"symlink":            {ImageOptions{FilesToSign: []string{"/" + modDir + "link.ko"}}, ClassNotModule},
		"relative path":      {ImageOptions{FilesToSign: []string{modDir + "m.ko"}}, ClassInvalidInput},
		"bad glob":           {ImageOptions{FilesToSign: []string{"/opt/[.ko"}}, ClassInvalidInput},
		"empty filesToSign":  {ImageOptions{}, ClassInvalidInput},
		"too many files":     {ImageOptions{FilesToSign: []string{"/" + modDir + "[mn].ko"}, Limits: ImageLimits{MaxFiles: 1}}, ClassTooLarge},
		"image too large":    {ImageOptions{FilesToSign: []string{"/" + modDir + "m.ko"}, Limits: ImageLimits{MaxImageBytes: 10}}, ClassTooLarge},
		"layers too large":   {ImageOptions{FilesToSign: []string{"/" + modDir + "m.ko"}, Limits: ImageLimits{MaxTarBytes: 100}}, ClassTooLarge},
		"missing image":      {ImageOptions{Source: host + "/kmod/absent:v1", FilesToSign: []string{"/x"}}, ClassPull},
		"unreachable target": {ImageOptions{Target: "127.0.0.1:1/kmod/signed:v1", FilesToSign: []string{"/" + modDir + "m.ko"}}, ClassPush},
	}
	for n, c := range cases {
		if c.o.Source == "" {
			c.o.Source = host + "/kmod/unsigned:v1"
		}
		if c.o.Target == "" {
			c.o.Target = host + "/kmod/signed:" + strings.ReplaceAll(n, " ", "-")
		}
		_, err := Image(context.Background(), kp.signer(t, crypto.SHA256), c.o)
		if ClassOf(err) != c.want {
			t.Errorf("%s: %v (class %q), want class %q", n, err, ClassOf(err), c.want)
		}
		if ref, _ := name.ParseReference(c.o.Target); ref != nil && c.want != ClassPush {
			if _, err := remote.Head(ref); err == nil {
				t.Errorf("%s: %s was pushed", n, c.o.Target)
			}
		}
	}
}
