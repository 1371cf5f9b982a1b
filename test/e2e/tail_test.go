package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileTail checks what a failed guest boot quotes of the console: the last lines of a log
// longer than the window read, in order, and the error when the log is missing.
func TestFileTail(t *testing.T) {
	var b strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&b, "console line %d\n", i)
	}
	path := filepath.Join(t.TempDir(), "console.log")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "console line 4997\nconsole line 4998\nconsole line 4999"
	if got := fileTail(path, 3); got != want {
		t.Errorf("fileTail = %q, want %q", got, want)
	}
	if got := fileTail(filepath.Join(t.TempDir(), "absent"), 3); !strings.Contains(got, "no such file") {
		t.Errorf("fileTail of a missing file = %q, want the error", got)
	}
}
