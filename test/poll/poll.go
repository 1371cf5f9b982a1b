// Package poll is the one poll-until helper of the tests: envtest scenarios wait for controllers
// and agents that act asynchronously.
package poll

import (
	"testing"
	"time"
)

// Until calls cond every interval until it returns true, and fails t when timeout passes first,
// with the last description cond gave of what it waits for.
func Until(t testing.TB, timeout, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, what := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", timeout, what)
			return // a testing.TB whose Fatalf does not stop the goroutine
		}
		time.Sleep(interval)
	}
}
