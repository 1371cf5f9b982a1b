package netport

import "testing"

// TestFreeNDistinct checks that FreeN gives n distinct ports, each of which can then be listened on.
func TestFreeNDistinct(t *testing.T) {
	ports, err := FreeN("127.0.0.1", 5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: not distinct positive ports", ports)
		}
		seen[p] = true
	}
	if p, err := Free("127.0.0.1"); err != nil || p <= 0 {
		t.Fatalf("Free: %d, %v", p, err)
	}
}
