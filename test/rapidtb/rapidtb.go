// Package rapidtb lets a rapid run fail without failing the test around it, so that a test can
// assert that rapid finds a counterexample (the seeded-fault tests of fsm and upgrade).
package rapidtb

import (
	"flag"
	"fmt"
	"strings"
	"testing"
)

// Recorder is a rapid.TB that records failures instead of failing the wrapped test.
type Recorder struct {
	*testing.T
	failed bool
	msgs   []string
}

// New wraps t.
func New(t *testing.T) *Recorder { return &Recorder{T: t} }

// Errorf records a failure.
func (r *Recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

// Error records a failure.
func (r *Recorder) Error(args ...any) { r.fail(fmt.Sprint(args...)) }

// Fatalf records a failure; rapid stops its run after it.
func (r *Recorder) Fatalf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

// Fatal records a failure; rapid stops its run after it.
func (r *Recorder) Fatal(args ...any) { r.fail(fmt.Sprint(args...)) }

// FailNow records a failure.
func (r *Recorder) FailNow() { r.failed = true }

// Fail records a failure.
func (r *Recorder) Fail() { r.failed = true }

// Failed says whether anything failed.
func (r *Recorder) Failed() bool { return r.failed }

// Logf drops rapid's log lines (the counterexample is in the failure messages).
func (r *Recorder) Logf(string, ...any) {}

// Log drops rapid's log lines.
func (r *Recorder) Log(...any) {}

// Messages returns the failure messages, joined by newlines.
func (r *Recorder) Messages() string { return strings.Join(r.msgs, "\n") }

func (r *Recorder) fail(msg string) {
	r.failed = true
	r.msgs = append(r.msgs, msg)
}

// SetFlag sets a command-line flag (such as rapid.checks) for the rest of t and restores it after.
func SetFlag(t *testing.T, name, value string) {
	t.Helper()
	f := flag.Lookup(name)
	if f == nil {
		t.Fatalf("no flag %s", name)
	}
	old := f.Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}
