package poll

import (
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records Fatalf instead of stopping the test.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
	if len(args) > 1 {
		r.failed = args[1].(string)
	}
}

func TestUntil(t *testing.T) {
	n := 0
	Until(t, time.Second, time.Millisecond, func() (bool, string) { n++; return n == 3, "three calls" })
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
	r := &recorder{TB: t}
	Until(r, 20*time.Millisecond, time.Millisecond, func() (bool, string) { return false, "never true" })
	if !strings.Contains(r.failed, "never true") {
		t.Fatalf("a condition that never holds did not fail the test with its description: %q", r.failed)
	}
}
