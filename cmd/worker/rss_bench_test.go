package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// BenchmarkWorkerPeakRSS runs the built worker binary (--dry-run, real modprobe -n) against a
// loopback registry and reports its peak RSS (the kernel's maxrss, i.e. VmHWM) for a normal image,
// a 100 MiB image and hostile images cut by the limits, to size the worker pod's memory limit.
func BenchmarkWorkerPeakRSS(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "worker")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v: %s", err, out)
	}
	base := kmodImage(b)
	host := authRegistry(b)
	kd := "opt/lib/modules/" + kernel
	cases := []struct {
		name string
		img  v1.Image
	}{
		{"normal", base},
		{"100MiB", appendLayer(b, base, randomFiles(kd+"/extra/big", 25, 4<<20))},
		{"manifest-99MiB", mutate.Annotations(base, map[string]string{"padding": strings.Repeat("p", 99<<20)}).(v1.Image)},
		{"files-100000", appendLayer(b, base, tinyFiles(kd+"/many/f", 100_000))},
		{"zipbomb-4GiB-skipped", appendLayer(b, base, zeroFile(b, "usr/share/bomb", 4<<30))},
	}
	for _, c := range cases {
		ref := pushTo(b, host, "kmod/"+strings.ToLower(c.name)+":v1", c.img)
		b.Run(c.name, func(b *testing.B) {
			var maxKiB int64
			var res string
			for range b.N {
				kib, r := runWorker(b, bin, host, ref)
				maxKiB, res = max(maxKiB, kib), r
			}
			b.ReportMetric(float64(maxKiB)/1024, "peak-RSS-MiB")
			b.Logf("%s: peak RSS %.1f MiB: %s", c.name, float64(maxKiB)/1024, res)
		})
	}
}

// runWorker runs one dry-run load and returns the peak RSS in KiB and the result.
func runWorker(b *testing.B, bin, host, ref string) (int64, string) {
	e := newEnv(b, fmt.Sprintf(`{"namespace":"ns","name":"m","config":{"kernelVersion":%q,"containerImage":%q,"modprobe":{"moduleName":"kmm_cmd"}}}`, kernel, ref))
	auth := base64.StdEncoding.EncodeToString([]byte("kmm:pw"))
	if err := os.WriteFile(e.secret, fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth), 0o600); err != nil {
		b.Fatal(err)
	}
	// GNU time forks the worker from its own small process: the maxrss of a child forked from this
	// (large) test process would start at this process's peak.
	rss := filepath.Join(e.dir, "maxrss")
	args := append([]string{"-f", "%M", "-o", rss, bin}, e.args("load", "--pull-secret", e.secret, "--modprobe", tool(b, "modprobe", "kmod"))...)
	out, _ := exec.Command(tool(b, "time", "time"), args...).CombinedOutput()
	lines := strings.Split(strings.TrimSpace(readFile(rss)), "\n") // a failed run adds a first line
	kib, err := strconv.ParseInt(lines[len(lines)-1], 10, 64)
	if err != nil {
		b.Fatalf("no peak RSS from GNU time: %v: %s", err, out)
	}
	return kib, readFile(e.termLog)
}

func readFile(f string) string {
	data, _ := os.ReadFile(f)
	return string(data)
}

func appendLayer(b *testing.B, img v1.Image, gz []byte) v1.Image {
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(gz)), nil })
	if err != nil {
		b.Fatal(err)
	}
	out, err := mutate.AppendLayers(img, l)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// tarGz writes files (name -> content generator) as a gzip-compressed tar archive.
func tarGz(n int, name func(int) string, body func(int) []byte) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for i := range n {
		data := body(i)
		_ = tw.WriteHeader(&tar.Header{Name: name(i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
		_, _ = tw.Write(data) // writes to memory cannot fail
	}
	_ = tw.Close()
	_ = gz.Close()
	return buf.Bytes()
}

func randomFiles(prefix string, n, size int) []byte {
	return tarGz(n, func(i int) string { return fmt.Sprintf("%s%02d.ko", prefix, i) }, func(int) []byte {
		data := make([]byte, size)
		_, _ = rand.Read(data)
		return data
	})
}

func tinyFiles(prefix string, n int) []byte {
	return tarGz(n, func(i int) string { return fmt.Sprintf("%s%06d", prefix, i) }, func(int) []byte { return []byte("x") })
}

// zeroFile is a layer with one file of zeros, as a multi-member gzip stream repeating one
// compressed MiB (quick to build, a few MiB to push).
func zeroFile(b *testing.B, name string, size int64) []byte {
	member := func(data []byte) []byte {
		var buf bytes.Buffer
		gz, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = gz.Write(data)
		_ = gz.Close()
		return buf.Bytes()
	}
	var hdr bytes.Buffer
	if err := tar.NewWriter(&hdr).WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		b.Fatal(err)
	}
	out := member(hdr.Bytes())
	mib := member(make([]byte, 1<<20))
	for range size >> 20 {
		out = append(out, mib...)
	}
	return append(out, member(make([]byte, 1024))...)
}
