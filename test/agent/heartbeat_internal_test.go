package agent

import (
	"testing"
	"time"
)

// TestTurnsSpreadEvenlyAndDropWhatWasMissed: every node has one turn per period, in order, spread
// over it; turns missed while nobody asked (a slow setup) are dropped, not handed out at once.
func TestTurnsSpreadEvenlyAndDropWhatWasMissed(t *testing.T) {
	nodes := make([]string, 100)
	for i := range nodes {
		nodes[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	tr := &turns{period: 10 * time.Second}
	start := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	seen := map[string]int{}
	for i := 0; i <= 100; i++ { // one period in ticks
		for _, n := range tr.due(nodes, start.Add(time.Duration(i)*heartbeatTick)) {
			seen[n]++
		}
	}
	for _, n := range nodes {
		if seen[n] != 1 {
			t.Fatalf("node %s had %d turns in one period, want 1 (%v)", n, seen[n], seen)
		}
	}
	late := tr.due(nodes, start.Add(10*time.Minute))
	if len(late) > 2*(len(nodes)/100+1) {
		t.Errorf("after a 10 min gap %d turns at once, want the missed ones dropped", len(late))
	}
}
