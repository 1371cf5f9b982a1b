package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// The tests build the images as make images does, with one difference that keeps them fast: the
// manager binary is a stand-in (this command, a static Go program like the manager), because
// cross-compiling the operator with -trimpath takes minutes per architecture on a cold cache and
// its assembly into the image is the same as any other binary's. The worker binary is the real
// one. Debian's packages come through the same cache as make images (bin/images/cache), so the
// tests fetch them with apt-get on their first run.

// repoRoot is the module root, two levels above this package.
const repoRoot = "../.."

// testEpoch is the build time the tests use.
var testEpoch = time.Unix(1700000000, 0).UTC()

// testPlatforms are the platforms make images builds.
var testPlatforms = []platform{knownPlatforms["linux/amd64"], knownPlatforms["linux/arm64"]}

var fixture struct {
	once sync.Once
	err  error
	dir  string
	bins map[string]binaries
	set  *imageSet
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixture.dir != "" {
		_ = os.RemoveAll(fixture.dir)
	}
	os.Exit(code)
}

// testDebian is the Debian package source of the tests: make images' cache.
func testDebian(t testing.TB) *debian {
	t.Helper()
	return &debian{Dir: filepath.Join(repoRoot, "bin", "images", "cache"), Mirror: "http://deb.debian.org/debian",
		SecurityMirror: "http://deb.debian.org/debian-security", Suite: "bookworm", MaxAge: 24 * time.Hour, Log: testWriter{t}}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testBinaries builds, once per test binary, the worker and the stand-in manager for every test
// platform, and assembles the images once.
func testImages(t *testing.T) (map[string]binaries, *imageSet) {
	t.Helper()
	fixture.once.Do(func() {
		fixture.err = func() error {
			dir, err := os.MkdirTemp("", "kmm-images-test-")
			if err != nil {
				return err
			}
			fixture.dir = dir
			fixture.bins = map[string]binaries{}
			start := time.Now()
			defer func() { t.Logf("fixture: binaries and images in %s", time.Since(start).Round(100*time.Millisecond)) }()
			for _, p := range testPlatforms {
				out := filepath.Join(dir, p.GOARCH)
				args := append([]string{"build"}, goBuildFlags...)
				args = append(args, "-o", out+"/", "./cmd/worker", "./hack/images")
				cmd := exec.Command("go", args...)
				cmd.Dir = repoRoot
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+p.GOARCH)
				if msg, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("go build for %s: %w: %s", p, err, msg)
				}
				fixture.bins[p.String()] = binaries{Manager: filepath.Join(out, "images"), Worker: filepath.Join(out, "worker")}
			}
			t.Logf("fixture: go build in %s", time.Since(start).Round(100*time.Millisecond))
			unlock, err := lockDir(testDebian(t).Dir)
			if err != nil {
				return err
			}
			defer unlock()
			fixture.set, err = assemble(context.Background(), assembleOptions{Platforms: testPlatforms, Binaries: fixture.bins, Debian: testDebian(t), Epoch: testEpoch})
			return err
		}()
	})
	if fixture.err != nil {
		t.Fatal(fixture.err)
	}
	return fixture.bins, fixture.set
}

// platformImage returns the image of idx for p.
func platformImage(t *testing.T, idx v1.ImageIndex, p platform) v1.Image {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.Equals(*p.oci()) {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("no image for %s in the index", p)
	return nil
}

// entry is one entry of an image's flattened file system.
type entry struct {
	Type byte
	Mode int64
	UID  int
	GID  int
	Time time.Time
	Link string
	Data []byte
}

// imageFiles flattens img (go-containerregistry's mutate.Extract) and returns its entries by
// path, without a leading slash or trailing slash.
func imageFiles(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	files := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.Trim(hdr.Name, "/")
		if _, dup := files[name]; dup {
			t.Errorf("%s twice in the flattened image", name)
		}
		files[name] = entry{Type: hdr.Typeflag, Mode: hdr.Mode, UID: hdr.Uid, GID: hdr.Gid, Time: hdr.ModTime, Link: hdr.Linkname, Data: data}
	}
	return files
}

// nonDirs returns the paths of the entries that are not directories, sorted.
func nonDirs(files map[string]entry) []string {
	var out []string
	for p, e := range files {
		if e.Type != tar.TypeDir {
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}
