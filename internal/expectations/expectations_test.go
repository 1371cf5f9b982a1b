package expectations

import (
	"testing"
	"time"
)

func TestStoreLifecycle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := New[string, string](30 * time.Second)
	s.Expect("node-a/version", "v2", t0)
	if v, ok := s.Get("node-a/version", t0.Add(29*time.Second)); !ok || v != "v2" {
		t.Fatalf("Get before the TTL = %q, %v; want v2, true", v, ok)
	}
	if _, ok := s.Get("node-a/version", t0.Add(31*time.Second)); ok {
		t.Fatal("Get after the TTL still returned the record")
	}
	if _, ok := s.Get("node-b/version", t0); ok {
		t.Fatal("Get of a key never written returned a record")
	}

	s.Observed("node-a/version", func(v string) bool { return v == "v1" })
	if s.Len() != 1 {
		t.Fatal("Observed forgot a record the cache does not show yet")
	}
	s.Observed("node-a/version", func(v string) bool { return v == "v2" })
	if s.Len() != 0 {
		t.Fatal("Observed kept a record the cache shows")
	}

	s.Expect("old", "x", t0)
	s.Expect("new", "y", t0.Add(40*time.Second))
	s.Prune(t0.Add(45 * time.Second))
	if _, ok := s.Get("new", t0.Add(45*time.Second)); !ok || s.Len() != 1 {
		t.Fatalf("Prune kept %d records; want only the unexpired one", s.Len())
	}
}
