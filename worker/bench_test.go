package worker

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// benchImageBytes is the size of the generated kmod image's module files (SPEC §10: 100 MiB).
const (
	benchFiles     = 25
	benchFileBytes = 4 << 20
)

var (
	benchOnce sync.Once
	benchReg  *testRegistry
	benchRef  string
)

// benchImage pushes, once per test binary, a ~100 MiB kmod image of random (incompressible)
// .ko-like files under the kernel directory, so that both the worker and crane must move every byte.
func benchImage(b *testing.B) (*testRegistry, string) {
	b.Helper()
	benchOnce.Do(func() {
		entries := []entry{dir("opt/lib/modules/" + testKernel + "/extra/")}
		buf := make([]byte, benchFileBytes)
		for i := 0; i < benchFiles; i++ {
			_, _ = rand.Read(buf)
			entries = append(entries, file(fmt.Sprintf("opt/lib/modules/%s/extra/big%02d.ko", testKernel, i), string(buf)))
		}
		benchReg = startRegistry(registryOpts{})
		benchRef, _ = benchReg.push(b, "kmod/big:v1", image(b, entries))
	})
	return benchReg, benchRef
}

// pullExtract is one cold pull and extraction by the worker into a fresh cache; only the pull and
// extraction run with the benchmark timer on.
func pullExtract(b *testing.B, ref string) time.Duration {
	b.Helper()
	b.StopTimer()
	cacheDir, err := os.MkdirTemp(b.TempDir(), "cache-")
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		b.StopTimer()
		_ = os.RemoveAll(cacheDir)
		b.StartTimer()
	}()
	w, err := New(Options{CacheDir: cacheDir, Modprobe: ModprobeFunc(nil), Host: NewSandboxHost(b.TempDir())})
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	got, err := w.fetch(context.Background(), "default", testConfig(ref).Config)
	elapsed := time.Since(start)
	if err != nil || got.fromCache {
		b.Fatalf("pull+extract: %v (fromCache %v)", err, got.fromCache)
	}
	return elapsed
}

// craneExport is one `crane export` of the image to a file (what `crane export <ref> out.tar` does).
func craneExport(b *testing.B, ref string) time.Duration {
	b.Helper()
	out := filepath.Join(b.TempDir(), "export.tar")
	defer func() {
		b.StopTimer()
		_ = os.Remove(out)
		b.StartTimer()
	}()
	start := time.Now()
	img, err := crane.Pull(ref)
	if err == nil {
		err = exportTo(img, out)
	}
	elapsed := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	return elapsed
}

func exportTo(img v1.Image, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := crane.Export(img, f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// BenchmarkPullExtract measures a cold pull and extraction of a ~100 MiB kmod image from the
// loopback registry.
func BenchmarkPullExtract(b *testing.B) {
	_, ref := benchImage(b)
	b.SetBytes(benchFiles * benchFileBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pullExtract(b, ref)
	}
}

// BenchmarkCraneExport measures go-containerregistry's `crane export` of the same image to a file.
func BenchmarkCraneExport(b *testing.B) {
	_, ref := benchImage(b)
	b.SetBytes(benchFiles * benchFileBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		craneExport(b, ref)
	}
}

// BenchmarkPullExtractVsCraneExport alternates the two, so that machine noise hits both alike, and
// reports the ratio of the worker's total time to crane's (SPEC §10 target: at most 1.2).
func BenchmarkPullExtractVsCraneExport(b *testing.B) {
	_, ref := benchImage(b)
	var ours, theirs time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		theirs += craneExport(b, ref)
		ours += pullExtract(b, ref)
	}
	b.ReportMetric(float64(ours.Milliseconds())/float64(b.N), "worker-ms/op")
	b.ReportMetric(float64(theirs.Milliseconds())/float64(b.N), "crane-ms/op")
	b.ReportMetric(float64(ours)/float64(theirs), "ratio")
}
