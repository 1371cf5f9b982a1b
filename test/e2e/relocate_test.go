package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRelocateHeadersIncludesTheCommonHeadersBeside: a headers Makefile that includes the common
// headers by an absolute path elsewhere (Debian's, or another checkout's cache) includes the ones
// beside it after relocateHeaders, as make run in the headers folder shows; a second call changes
// nothing.
func TestRelocateHeadersIncludesTheCommonHeadersBeside(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed (Debian's make, installed with gcc): %v", err)
	}
	src := filepath.Join(t.TempDir(), "usr", "src")
	headers, common := filepath.Join(src, "linux-headers-1.0-cloud"), filepath.Join(src, "linux-headers-1.0-common")
	for _, d := range []string{headers, common} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(common, "Makefile"), "all:\n\t@echo common-included\n")
	write(filepath.Join(headers, "Makefile"), "include /elsewhere/bin/cache/usr/src/linux-headers-1.0-common/Makefile\n")
	for range 2 {
		if err := relocateHeaders(headers); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("make", "-s", "-C", headers).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "common-included" {
		t.Fatalf("make in the relocated headers: %v: %s", err, out)
	}
}
