package worker

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kmm-project/kmm/contract"
)

// TestHostileOrBrokenImages pushes images with unsafe or broken content and checks that each
// load fails with a classified error naming the entry and the reason, writes nothing outside the
// extraction root, and leaves no cache entry behind.
func TestHostileOrBrokenImages(t *testing.T) {
	kd := "opt/lib/modules/" + testKernel
	outside := filepath.Join(t.TempDir(), "outside") // an absolute path an attacker would like to write
	cases := []struct {
		name     string
		extra    []entry
		raw      []byte // a raw (non-tar) layer instead of extra
		img      func(t *testing.T) v1.Image
		maxBytes int64
		limits   Limits
		kernel   string
		firmware string
		reason   contract.Reason
		want     []string
	}{
		{name: "path traversal", extra: []entry{file(kd+"/../../../../../../../"+strings.TrimPrefix(outside, "/"), "pwned")},
			reason: contract.ReasonOther, want: []string{`unsafe archive entry`, `".." path component`, kd + "/../"}},
		{name: "absolute path", extra: []entry{file(outside, "pwned")},
			reason: contract.ReasonOther, want: []string{"unsafe archive entry", "absolute path", outside}},
		{name: "symlink pointing outside", extra: []entry{{Name: kd + "/escape", Type: tar.TypeSymlink, Linkname: "../../../../../" + strings.Repeat("../", 20) + strings.TrimPrefix(outside, "/")}, file(kd+"/escape/x", "pwned")},
			reason: contract.ReasonOther, want: []string{"unsafe archive entry", kd + "/escape", "points outside the extraction root"}},
		{name: "symlink escaping through another symlink", extra: []entry{{Name: kd + "/d", Type: tar.TypeSymlink, Linkname: "."}, {Name: kd + "/e", Type: tar.TypeSymlink, Linkname: "d/../../../../../x"}},
			reason: contract.ReasonOther, want: []string{"unsafe archive entry", kd + "/e", "does not resolve inside the extraction root"}},
		{name: "hard link outside", extra: []entry{{Name: kd + "/h", Type: tar.TypeLink, Linkname: outside}},
			reason: contract.ReasonOther, want: []string{"unsafe archive entry", kd + "/h", "hard link", "outside the extraction root"}},
		{name: "hard link to an unextracted file", extra: []entry{file("etc/shadow", "secret"), {Name: kd + "/h", Type: tar.TypeLink, Linkname: "etc/shadow"}},
			reason: contract.ReasonOther, want: []string{kd + "/h", "outside the extracted directories"}},
		{name: "device file", extra: []entry{{Name: kd + "/sda", Type: tar.TypeBlock}},
			reason: contract.ReasonOther, want: []string{"unsafe archive entry", kd + "/sda", "device file"}},
		{name: "fifo", extra: []entry{{Name: kd + "/p", Type: tar.TypeFifo}},
			reason: contract.ReasonOther, want: []string{kd + "/p", "fifo"}},
		{name: "layer over the cap", extra: []entry{file(kd+"/big.ko", strings.Repeat("x", 200<<10))}, maxBytes: 100 << 10,
			reason: contract.ReasonOther, want: []string{kd + "/big.ko", "exceed the extraction size cap of 102400 bytes"}},
		{name: "too many layers", img: func(t *testing.T) v1.Image {
			return image(t, kmodEntries(t, "opt"), []entry{file("a", "1")}, []entry{file("b", "2")}, []entry{file("c", "3")}, []entry{file("d", "4")})
		}, limits: Limits{MaxLayers: 4},
			reason: contract.ReasonOther, want: []string{"the image has 5 layers", "over the worker limit maxLayers of 4"}},
		{name: "too many entries examined", extra: manyFiles("usr/share/doc/", 60), limits: Limits{MaxEntries: 50},
			reason: contract.ReasonOther, want: []string{"more than 50 archive entries", "maxEntries of 50"}},
		{name: "too many entries extracted", extra: manyFiles(kd+"/extra/many/", 60), limits: Limits{MaxExtractEntries: 50},
			reason: contract.ReasonOther, want: []string{"more than 50 entries in the extracted directories", "maxExtractEntries of 50"}},
		{name: "too many compressed bytes", limits: Limits{MaxImageBytes: 1000},
			reason: contract.ReasonOther, want: []string{"compressed bytes", "maxImageBytes of 1000"}},
		{name: "too many uncompressed bytes in skipped entries", extra: []entry{file("usr/share/big", strings.Repeat("z", 2<<20))}, limits: Limits{MaxTarBytes: 1 << 20},
			reason: contract.ReasonOther, want: []string{"more than 1048576 uncompressed bytes", "maxTarBytes of 1048576"}},
		{name: "manifest over the cap", img: func(t *testing.T) v1.Image {
			return mutate.Annotations(image(t, kmodEntries(t, "opt")), map[string]string{"padding": strings.Repeat("p", 64<<10)}).(v1.Image)
		}, limits: Limits{MaxManifestBytes: 32 << 10},
			reason: contract.ReasonOther, want: []string{"the manifest is", "maxManifestBytes of 32768"}},
		{name: "path too deep", extra: []entry{file(kd+"/"+strings.Repeat("d/", 70)+"x.ko", "x")},
			reason: contract.ReasonOther, want: []string{"archive entry", "has a path 75 components deep", "over the worker limit maxPathDepth of 64"}},
		{name: "path too long", extra: []entry{file(kd+"/"+strings.Repeat("n", 5000), "x")},
			reason: contract.ReasonOther, want: []string{"has a path of 5030 bytes", "over the worker limit maxPathBytes of 4096"}},
		{name: "symlink target too long", extra: []entry{{Name: kd + "/l", Type: tar.TypeSymlink, Linkname: strings.Repeat("a/", 39) + "a"}},
			limits: Limits{MaxPathDepth: 32},
			reason: contract.ReasonOther, want: []string{kd + "/l", "has a link target 40 components deep", "maxPathDepth of 32"}},
		{name: "missing kernel directory", kernel: "6.9.9-absent",
			reason: contract.ReasonNotFound, want: []string{"no directory /opt/lib/modules/6.9.9-absent", "kernel directories in the image: " + testKernel}},
		{name: "missing firmware directory", firmware: "/firmware",
			reason: contract.ReasonNotFound, want: []string{"no firmware directory /firmware"}},
		{name: "layer that is not a tar archive", raw: bytes.Repeat([]byte("not a tar archive "), 100),
			reason: contract.ReasonOther, want: []string{"layer 1 is not a valid tar archive"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := newTestRegistry(t, registryOpts{})
			img := image(t, kmodEntries(t, "opt"))
			if tc.img != nil {
				img = tc.img(t)
			} else if tc.raw != nil {
				img = appendRawLayer(t, img, tc.raw)
			} else if tc.extra != nil {
				img = image(t, kmodEntries(t, "opt"), tc.extra)
			}
			ref, digest := reg.push(t, "kmod/hostile:v1", img)
			s := newSandbox(t)
			cfg := testConfig(ref)
			if tc.kernel != "" {
				cfg.Config.KernelVersion = tc.kernel
			}
			cfg.Config.Modprobe.FirmwarePath = tc.firmware
			m := newRecorder(t)
			res := newTestWorker(t, s, m, func(o *Options) { o.MaxExtractBytes, o.Limits = tc.maxBytes, tc.limits }).Run(context.Background(), contract.ActionLoad, cfg)

			t.Logf("message: %s", res.Message)
			if res.Outcome != contract.OutcomeFailed || res.Reason != tc.reason {
				t.Fatalf("outcome %s reason %s, want Failed %s: %s", res.Outcome, res.Reason, tc.reason, res.Message)
			}
			for _, w := range tc.want {
				if !strings.Contains(res.Message, w) {
					t.Errorf("message %q does not say %q", res.Message, w)
				}
			}
			if len(m.calls) != 0 {
				t.Errorf("modprobe ran after a failed extraction: %q", m.calls)
			}
			if _, err := os.Lstat(outside); !os.IsNotExist(err) {
				t.Errorf("something was written outside the extraction root at %s", outside)
			}
			if got := listFiles(t, s.root); strings.Join(got, ",") != "proc,proc/sys,proc/sys/kernel,proc/sys/kernel/random,proc/sys/kernel/random/boot_id" {
				t.Errorf("the host root changed: %v", got)
			}
			for _, f := range listFiles(t, s.cache) {
				if strings.HasPrefix(f, ".extract-") || strings.Count(f, "/") > 0 && strings.HasPrefix(f, digest.Hex) {
					t.Errorf("a failed extraction left %s in the cache", f)
				}
			}
			if (cache{dir: s.cache}).has(digest, extractKey(cfg.Config)) {
				t.Errorf("a failed extraction left a cache entry a later run would trust")
			}
		})
	}
}

func appendRawLayer(t *testing.T, img v1.Image, data []byte) v1.Image {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	out, err := mutate.AppendLayers(img, l)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWhiteoutsHideLowerLayers(t *testing.T) {
	kd := "opt/lib/modules/" + testKernel
	reg := newTestRegistry(t, registryOpts{})
	img := image(t,
		append(kmodEntries(t, "opt"), file(kd+"/old.ko", "old"), file(kd+"/stale/a", "a"), file("firmware/f1", "1")),
		[]entry{file(kd+"/.wh.old.ko", ""), file(kd+"/stale/b", "new in this layer"), file(kd+"/stale/.wh..wh..opq", ""), file("firmware/.wh..wh..opq", ""), file("firmware/f2", "2")},
	)
	ref, digest := reg.push(t, "kmod/wh:v1", img)
	s := newSandbox(t)
	cfg := testConfig(ref)
	cfg.Config.Modprobe.FirmwarePath = "/firmware"
	mustSucceed(t, newTestWorker(t, s, newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg))
	root := entryRoot(s, digest, cfg)
	for f, want := range map[string]bool{kd + "/old.ko": false, kd + "/stale/a": false, kd + "/stale/b": true, "firmware/f1": false, "firmware/f2": true, kd + "/extra/kmm_test_a.ko": true} {
		if _, err := os.Lstat(filepath.Join(root, f)); (err == nil) != want {
			t.Errorf("%s present = %v, want %v", f, err == nil, want)
		}
	}
}

func TestAbsoluteSymlinksResolveInsideTheImage(t *testing.T) {
	kd := "opt/lib/modules/" + testKernel
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/abs:v1", image(t, kmodEntries(t, "opt"), []entry{
		{Name: kd + "/build", Type: tar.TypeSymlink, Linkname: "/usr/src/linux-headers"},
		{Name: kd + "/passwd", Type: tar.TypeSymlink, Linkname: "/etc/passwd"},
		{Name: kd + "/a.ko", Type: tar.TypeSymlink, Linkname: "/" + kd + "/extra/kmm_test_a.ko"},
	}))
	s := newSandbox(t)
	cfg := testConfig(ref)
	mustSucceed(t, newTestWorker(t, s, newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg))
	root := entryRoot(s, digest, cfg)
	if target, _ := os.Readlink(filepath.Join(root, kd, "passwd")); target != "../../../../etc/passwd" {
		t.Errorf("absolute symlink stored as %q, want it relative to the extraction root", target)
	}
	if _, err := os.Stat(filepath.Join(root, kd, "passwd")); !os.IsNotExist(err) {
		t.Errorf("/etc/passwd of the host is reachable through the extracted link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, kd, "a.ko")); err != nil {
		t.Errorf("an absolute link to a file of the image should resolve inside the extraction: %v", err)
	}
}

func TestAnUnfinishedExtractionIsNotTrusted(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	cfg := testConfig(ref)
	// A crashed run left an extraction directory (an hour old) and its digest record.
	stale := filepath.Join(s.cache, ".extract-crashed")
	if err := os.MkdirAll(filepath.Join(stale, "opt/lib/modules", testKernel), 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * staleExtraction)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	recent := filepath.Join(s.cache, ".extract-running")
	if err := os.MkdirAll(recent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := (cache{dir: s.cache}).recordRef(mustRef(t, ref), digest); err != nil {
		t.Fatal(err)
	}
	res := newTestWorker(t, s, newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg)
	mustSucceed(t, res)
	if res.FromCache || reg.blobGets.Load() == 0 {
		t.Errorf("the image must be downloaded again (fromCache %v, %d blob downloads)", res.FromCache, reg.blobGets.Load())
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the stale extraction directory is still there")
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("a recent extraction directory (maybe another worker's) was removed")
	}
}

func mustRef(t *testing.T, ref string) string {
	t.Helper()
	reg, err := newRegistryClient(context.Background(), testConfig(ref).Config, pullSettings{kc: staticKeychain{}, maxManifest: DefaultMaxManifestBytes})
	if err != nil {
		t.Fatal(err)
	}
	return reg.ref.Name()
}

// manyFiles returns n small files in the archive directory prefix.
func manyFiles(prefix string, n int) []entry {
	out := make([]entry, 0, n)
	for i := range n {
		out = append(out, file(fmt.Sprintf("%sf%05d", prefix, i), "x"))
	}
	return out
}
