package worker

import (
	"archive/tar"
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// scaleCase builds a hostile image whose size grows with n (archive entries): the work of
// extracting it must grow linearly with n.
type scaleCase struct {
	name   string
	layers func(tb testing.TB, n int) [][]entry
	// refused is what the error says when the case is cut by a limit ("" when it succeeds).
	refused string
}

const scaleKD = "opt/lib/modules/" + testKernel

var scaleCases = []scaleCase{
	// n/2 files, then a layer of n/2 whiteouts of them.
	{name: "whiteouts", layers: func(tb testing.TB, n int) [][]entry {
		var files, wh []entry
		for i := range n / 2 {
			files = append(files, file(fmt.Sprintf("%s/w/f%06d", scaleKD, i), "x"))
			wh = append(wh, file(fmt.Sprintf("%s/w/.wh.f%06d", scaleKD, i), ""))
		}
		return [][]entry{append(kmodEntries(tb, "opt"), files...), wh}
	}},
	// 50 layers, each with n/50 new directories holding a file (2n entries), and an opaque marker
	// over what the layers below wrote.
	{name: "opaque-every-layer", layers: func(tb testing.TB, n int) [][]entry {
		layers := [][]entry{kmodEntries(tb, "opt")}
		for l := range 50 {
			es := []entry{file(scaleKD+"/o/.wh..wh..opq", "")}
			for i := range n / 50 {
				d := fmt.Sprintf("%s/o/l%03d-d%06d/", scaleKD, l, i)
				es = append(es, dir(d), file(d+"f", "x"))
			}
			layers = append(layers, es)
		}
		return layers
	}},
	// n files in one directory.
	{name: "files", layers: func(tb testing.TB, n int) [][]entry {
		return [][]entry{append(kmodEntries(tb, "opt"), manyFiles(scaleKD+"/many/", n)...)}
	}},
	// n files outside the extracted directories (examined, skipped).
	{name: "skipped", layers: func(tb testing.TB, n int) [][]entry {
		return [][]entry{append(kmodEntries(tb, "opt"), manyFiles("usr/share/doc/", n)...)}
	}},
	// n whiteouts outside the extracted directories.
	{name: "skipped-whiteouts", layers: func(tb testing.TB, n int) [][]entry {
		es := kmodEntries(tb, "opt")
		for i := range n {
			es = append(es, file(fmt.Sprintf("usr/share/.wh.f%06d", i), ""))
		}
		return [][]entry{es}
	}},
	// n files, each 60 path components deep (the limit is 64).
	{name: "deep-paths", layers: func(tb testing.TB, n int) [][]entry {
		deep := scaleKD + "/" + strings.Repeat("d/", 55)
		return [][]entry{append(kmodEntries(tb, "opt"), manyFiles(deep, n)...)}
	}},
	// n files with names of 200 bytes.
	{name: "long-names", layers: func(tb testing.TB, n int) [][]entry {
		return [][]entry{append(kmodEntries(tb, "opt"), manyFiles(scaleKD+"/long/"+strings.Repeat("n", 190), n)...)}
	}},
	// n symlinks in chains of 8 (each link points at the previous one).
	{name: "link-chains", layers: func(tb testing.TB, n int) [][]entry {
		es := append(kmodEntries(tb, "opt"), file(scaleKD+"/l/target", "x"))
		for i := range n {
			prev := "target"
			if i%8 != 0 {
				prev = fmt.Sprintf("s%06d", i-1)
			}
			es = append(es, entry{Name: fmt.Sprintf("%s/l/s%06d", scaleKD, i), Type: tar.TypeSymlink, Linkname: prev})
		}
		return [][]entry{es}
	}},
	// n hard links to one file.
	{name: "hard-links", layers: func(tb testing.TB, n int) [][]entry {
		es := append(kmodEntries(tb, "opt"), file(scaleKD+"/h/target", "x"))
		for i := range n {
			es = append(es, entry{Name: fmt.Sprintf("%s/h/h%06d", scaleKD, i), Type: tar.TypeLink, Linkname: scaleKD + "/h/target"})
		}
		return [][]entry{es}
	}},
	// 64 layers that each write the same n/64 files again.
	{name: "layers-rewriting", layers: func(tb testing.TB, n int) [][]entry {
		layers := [][]entry{kmodEntries(tb, "opt")}
		for range 64 {
			layers = append(layers, manyFiles(scaleKD+"/r/", n/64))
		}
		return layers
	}},
}

var scaleSizes = []int{10_000, 20_000, 40_000}

var (
	scaleMu     sync.Mutex
	scaleImages = map[string]v1.Image{}
)

// scaleImage builds (once per test binary) the image of case c at size n.
func scaleImage(tb testing.TB, c scaleCase, n int) v1.Image {
	tb.Helper()
	scaleMu.Lock()
	defer scaleMu.Unlock()
	key := fmt.Sprintf("%s/%d", c.name, n)
	if img, ok := scaleImages[key]; ok {
		return img
	}
	img := layersOnce(tb, image(tb, c.layers(tb, n)...))
	scaleImages[key] = img
	return img
}

// fixedLayers is an image whose Layers were computed once: go-containerregistry's in-memory
// mutate image computes its config again for each layer it is asked about (work quadratic in the
// layers, which a pulled image does not do), and the extraction's work is what is measured.
type fixedLayers struct {
	v1.Image
	layers []v1.Layer
}

func (f fixedLayers) Layers() ([]v1.Layer, error) { return f.layers, nil }

func layersOnce(tb testing.TB, img v1.Image) v1.Image {
	tb.Helper()
	ls, err := img.Layers()
	if err != nil {
		tb.Fatal(err)
	}
	return fixedLayers{Image: img, layers: ls}
}

// scaleLimits are high enough that no case is cut: the benchmark measures the work itself.
var scaleLimits = Limits{MaxEntries: 1 << 20, MaxExtractEntries: 1 << 20}.withDefaults()

// extractScale extracts img into a fresh directory below parent and removes it.
func extractScale(tb testing.TB, img v1.Image, parent string) {
	dir, err := os.MkdirTemp(parent, "x-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(dir) //nolint:errcheck // test
	spec := extractSpec{Filter: filter{Dirs: []string{scaleKD}}, KernelDir: scaleKD, MaxBytes: DefaultMaxExtractBytes, Limits: scaleLimits}
	if err := extractImage(context.Background(), img, dir, spec); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkHostileScaling extracts each hostile case at 10k, 20k and 40k entries (in memory, no
// registry, limits raised so that nothing is cut): ns/op must about double per doubling.
func BenchmarkHostileScaling(b *testing.B) {
	for _, c := range scaleCases {
		for _, n := range scaleSizes {
			b.Run(fmt.Sprintf("%s/n=%d", c.name, n), func(b *testing.B) {
				img := scaleImage(b, c, n)
				parent := scratchDir(b)
				b.ResetTimer()
				cpu0 := cpuTime()
				for range b.N {
					extractScale(b, img, parent)
				}
				// CPU time (user + system, this process) is steadier than wall time on a shared
				// machine; the counted work does not depend on the machine at all.
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
				dir, err := os.MkdirTemp(parent, "w-")
				if err != nil {
					b.Fatal(err)
				}
				spec := extractSpec{Filter: filter{Dirs: []string{scaleKD}}, KernelDir: scaleKD, MaxBytes: DefaultMaxExtractBytes, Limits: scaleLimits}
				w, _ := extractCounted(context.Background(), img, dir, spec)
				b.ReportMetric(float64(w.rootSteps+w.indexVisits), "work/op")
			})
		}
	}
}

// growthCases are the scale cases plus two whose size grows in a second dimension with n, too
// large for the benchmark's sizes: the number of layers (each with an opaque marker over what the
// layers below wrote), and the depth of the paths (entry i is i directories deep).
var growthCases = append(append([]scaleCase(nil), scaleCases...),
	scaleCase{name: "opaque-layers-grow", layers: func(tb testing.TB, n int) [][]entry {
		layers := [][]entry{kmodEntries(tb, "opt")}
		for l := range n / 8 {
			es := []entry{file(scaleKD+"/o/.wh..wh..opq", "")}
			for i := range 4 {
				d := fmt.Sprintf("%s/o/l%03d-d%02d/", scaleKD, l, i)
				es = append(es, dir(d), file(d+"f", "x"))
			}
			layers = append(layers, es)
		}
		return layers
	}},
	scaleCase{name: "deep-chain", layers: func(tb testing.TB, n int) [][]entry {
		es := kmodEntries(tb, "opt")
		p := scaleKD + "/c"
		for range n {
			p += "/d"
			es = append(es, dir(p+"/"))
		}
		return [][]entry{es}
	}, refused: "over the worker limit maxPathDepth of 64"},
)

// TestExtractionWorkIsLinear extracts each hostile case at n = 128, 256 and 512 entries and
// checks that the work grows linearly with n: the work added by the second doubling is at most
// 2.5 times the work added by the first (a quadratic step makes it 4). The work is counted, not
// timed: the path components handed to the extraction root (os.Root resolves each with a system
// call), the nodes of the path index visited, and the allocations (runtime.MemStats.Mallocs).
func TestExtractionWorkIsLinear(t *testing.T) {
	sizes := []int{128, 256, 512}
	for _, c := range growthCases {
		t.Run(c.name, func(t *testing.T) {
			var work, allocs [3]float64
			for i, n := range sizes {
				img := layersOnce(t, image(t, c.layers(t, n)...))
				parent := scratchDir(t)
				var w extractWork
				allocs[i] = countAllocs(func() {
					dir, err := os.MkdirTemp(parent, "x-")
					if err != nil {
						t.Fatal(err)
					}
					spec := extractSpec{Filter: filter{Dirs: []string{scaleKD}}, KernelDir: scaleKD, MaxBytes: DefaultMaxExtractBytes, Limits: scaleLimits}
					w, err = extractCounted(context.Background(), img, dir, spec)
					if (err == nil) != (c.refused == "") || err != nil && !strings.Contains(err.Error(), c.refused) {
						t.Errorf("n=%d: error %v, want one saying %q", n, err, c.refused)
					}
					_ = os.RemoveAll(dir)
				})
				work[i] = float64(w.rootSteps + w.indexVisits)
				t.Logf("n=%d: %+v, %.0f allocations", n, w, allocs[i])
			}
			for what, v := range map[string][3]float64{"work (root steps + index visits)": work, "allocations": allocs} {
				first, second := v[1]-v[0], v[2]-v[1]
				if second > 2.5*max(first, float64(sizes[0])) {
					t.Errorf("%s grows superlinearly: %.0f, %.0f, %.0f at n = %v (added %.0f, then %.0f)", what, v[0], v[1], v[2], sizes, first, second)
				}
			}
		})
	}
}

// countAllocs returns the heap allocations f makes (as testing.AllocsPerRun, with one run and no
// warm-up: f is deterministic and the first run is what is measured).
func countAllocs(f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs - before.Mallocs)
}

// scratchDir is a directory for extractions that is removed when tb ends: on tmpfs (/dev/shm)
// when there is one, so that what is measured is the worker's work, not the disk's (creating a
// file on this VM's ext4 costs 0.1 to 0.8 ms, on tmpfs 13 µs).
func scratchDir(tb testing.TB) string {
	tb.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "kmm-worker-scale-"); err == nil {
			tb.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return tb.TempDir()
}

// cpuTime is the user and system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
