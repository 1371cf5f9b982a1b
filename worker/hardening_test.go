package worker

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/contract"
)

// TestTamperedLayerIsAnImagePullFailure serves a layer whose bytes do not match the digest the
// manifest names: whatever the bytes hold, the failure is ImagePull (the download is wrong), not a
// complaint about the archive, and nothing is extracted into the cache or loaded.
func TestTamperedLayerIsAnImagePullFailure(t *testing.T) {
	kd := "opt/lib/modules/" + testKernel
	garbage := make([]byte, 3000)
	_, _ = rand.Read(garbage)
	cases := map[string][]byte{
		"bytes that are not an archive":      garbage,
		"another archive with unsafe entry":  compressedBytes(t, layer(t, []entry{file(kd+"/../../../../../../../tmp/pwned", "x")})),
		"another archive with harmless file": compressedBytes(t, layer(t, []entry{file(kd+"/extra/other.ko", "other")})),
		"another archive that is not tar":    compressedBytes(t, layer(t, nil))[:20],
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			img := image(t, kmodEntries(t, "opt"), []entry{file(kd+"/extra/second.ko", "second")})
			tampered := layerDigest(t, img, 1)
			reg := newTestRegistry(t, registryOpts{intercept: func(w http.ResponseWriter, r *http.Request, _ http.Handler) bool {
				if !isBlob(r, tampered) {
					return false
				}
				serveChunked(w, body)
				return true
			}})
			ref, digest := reg.push(t, "kmod/tampered:v1", img)
			s, m, cfg := newSandbox(t), newRecorder(t), testConfig(ref)
			res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg)
			t.Logf("message: %s", res.Message)
			if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "layer 1") ||
				!strings.Contains(res.Message, "does not match its digest") {
				t.Errorf("got %s %s %q, want ImagePull saying layer 1 does not match its digest", res.Outcome, res.Reason, res.Message)
			}
			assertNothingLoaded(t, s, m)
			if (cache{dir: s.cache}).has(digest, extractKey(cfg.Config)) {
				t.Errorf("a tampered image left a cache entry")
			}
		})
	}
}

// TestFirmwareIsAllOrNothing: an image whose firmware tree has good files and a dangling link
// fails to load, and none of its files reach the host's firmware directory.
func TestFirmwareIsAllOrNothing(t *testing.T) {
	fw := []entry{
		dir("firmware/"), file("firmware/a-good.bin", "GOOD"), file("firmware/b/nested.bin", "NESTED"),
		{Name: "firmware/z-dangling.bin", Type: tar.TypeSymlink, Linkname: "missing.bin"},
	}
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/fw:v1", image(t, append(kmodEntries(t, "opt"), fw...)))
	s, m, cfg := newSandbox(t), newRecorder(t), testConfig(ref)
	cfg.Config.Modprobe.FirmwarePath = "/firmware"
	cfg.SetFirmwareClassPath = true
	// A file of the same name already on the host stays as it was.
	hostFW := filepath.Join(s.root, "var/lib/firmware")
	if err := os.MkdirAll(hostFW, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostFW, "a-good.bin"), []byte("OLD"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg)
	t.Logf("message: %s", res.Message)
	if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonOther || !strings.Contains(res.Message, "z-dangling.bin") {
		t.Fatalf("got %s %s %q, want Other naming the dangling link", res.Outcome, res.Reason, res.Message)
	}
	if got := listFiles(t, hostFW); strings.Join(got, ",") != "a-good.bin" {
		t.Errorf("the host firmware directory holds %v, want only the file that was there before", got)
	}
	if data, _ := os.ReadFile(filepath.Join(hostFW, "a-good.bin")); string(data) != "OLD" {
		t.Errorf("a host file was replaced by a failed install: %q", data)
	}
	if _, err := os.Stat(filepath.Join(s.root, firmwareClassPath)); !os.IsNotExist(err) {
		t.Errorf("the firmware lookup path was set by a failed install")
	}
	if l := m.loads(); len(l) != 0 {
		t.Errorf("modprobe ran after a failed firmware install: %q", l)
	}
}

// tamperedModuleTree returns the kmod entries with every occurrence of old in the files named by
// names (e.g. modules.dep.bin) replaced by repl (of the same length, so the index stays valid).
func tamperedModuleTree(t *testing.T, replace map[string][2]string) []entry {
	t.Helper()
	entries := kmodEntries(t, "opt")
	for i, e := range entries {
		r, ok := replace[filepath.Base(e.Name)]
		if !ok {
			continue
		}
		if len(r[0]) != len(r[1]) || !strings.Contains(e.Body, r[0]) {
			t.Fatalf("test setup: cannot replace %q by %q in %s", r[0], r[1], e.Name)
		}
		entries[i].Body = strings.ReplaceAll(e.Body, r[0], r[1])
	}
	return entries
}

// TestModprobeCannotLeaveTheModuleDirectory crafts module indexes whose entries point outside the
// image's module directory; the real modprobe would insmod them. The worker must refuse before the
// load runs.
func TestModprobeCannotLeaveTheModuleDirectory(t *testing.T) {
	kd := "opt/lib/modules/" + testKernel
	const a, b = "extra/kmm_test_a.ko", "extra/kmm_test_b.ko"
	// Debian's kmod 30 reads only modules.dep.bin (a tampered modules.dep text without the index
	// makes modprobe say "not found"), so the index is what is tampered with. A dependency kmod cannot
	// open is skipped, so the relative climb lands on a file the image does have (its "firmware").
	cases := map[string]struct {
		entries  []entry
		firmware string
		want     string
	}{
		"absolute path in modules.dep.bin": {
			entries: tamperedModuleTree(t, map[string][2]string{"modules.dep.bin": {a, "/etc/////////passwd"}}),
			want:    "/etc/////////passwd"},
		"relative path climbing out in modules.dep.bin": {
			entries:  append(tamperedModuleTree(t, map[string][2]string{"modules.dep.bin": {b, "../../../etc/passwd"}}), file("opt/etc/passwd", "root:x:0:0")),
			firmware: "/opt/etc",
			want:     "opt/etc/passwd"},
		"module that is a link out of the module directory": {
			entries: append(func() []entry {
				var out []entry
				for _, e := range kmodEntries(t, "opt") {
					if !strings.HasSuffix(e.Name, "/kmm_test_b.ko") {
						out = append(out, e)
					}
				}
				return out
			}(), file("firmware/kmm_test_b.ko", "not a module"), entry{Name: kd + "/" + b, Type: tar.TypeSymlink, Linkname: "/firmware/kmm_test_b.ko"}),
			firmware: "/firmware",
			want:     "firmware/kmm_test_b.ko"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			reg := newTestRegistry(t, registryOpts{})
			ref, _ := reg.push(t, "kmod/escape:v1", image(t, tc.entries))
			s, m, cfg := newSandbox(t), newRecorder(t), testConfig(ref)
			cfg.Config.Modprobe.FirmwarePath = tc.firmware
			res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg)
			t.Logf("message: %s\nmodprobe output: %s", res.Message, m.stdout.String())
			if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonOther || !strings.Contains(res.Message, "outside the module directory") ||
				!strings.Contains(res.Message, tc.want) {
				t.Errorf("got %s %s %q, want Other refusing %q outside the module directory", res.Outcome, res.Reason, res.Message, tc.want)
			}
			if l := m.loads(); len(l) != 0 || len(m.calls) != 1 {
				t.Errorf("the load ran (%q) or the check did not (%d calls)", l, len(m.calls))
			}
		})
	}
}
