package scale

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestPullTimesAreSeededLongTailedAndBounded: the same key draws the same time, another seed other
// times; every time lies within the bounds; the median is near 2.5 Min and the spread has a tail
// (a tenth of the pods slower than twice the median, some at the longest).
func TestPullTimesAreSeededLongTailedAndBounded(t *testing.T) {
	p := PullTimes{Min: 2 * time.Second, Max: 30 * time.Second, Seed: 1}
	var all []time.Duration
	differs := 0
	for i := range 3000 {
		key := fmt.Sprintf("node-%04d kmm-scale/scale-%d load", i/3, i%3)
		d := p.draw(key)
		if d != p.draw(key) {
			t.Fatalf("%s drew %v, then %v", key, d, p.draw(key))
		}
		if d < p.Min || d > p.Max {
			t.Fatalf("%s drew %v, outside %v-%v", key, d, p.Min, p.Max)
		}
		if d != (PullTimes{Min: p.Min, Max: p.Max, Seed: 2}).draw(key) {
			differs++
		}
		all = append(all, d)
	}
	slices.Sort(all)
	p50, p90 := all[len(all)/2], all[len(all)*9/10]
	if p50 < 4*time.Second || p50 > 6*time.Second {
		t.Errorf("median %v, want about 5 s", p50)
	}
	if p90 < 2*p50 || all[len(all)-1] != p.Max || all[0] != p.Min {
		t.Errorf("no long tail: min %v, p50 %v, p90 %v, max %v", all[0], p50, p90, all[len(all)-1])
	}
	if differs < 2900 {
		t.Errorf("another seed drew the same time for %d of 3000 pods", 3000-differs)
	}
}

func TestParsePullTimes(t *testing.T) {
	if p, err := ParsePullTimes("2s-30s", 7); err != nil || p.Min != 2*time.Second || p.Max != 30*time.Second || p.Seed != 7 {
		t.Errorf("2s-30s: %+v, %v", p, err)
	}
	if p, err := ParsePullTimes("", 1); p != nil || err != nil {
		t.Errorf("empty: %+v, %v", p, err)
	}
	for _, bad := range []string{"2s", "30s-2s", "0s-1s", "x-1s"} {
		if _, err := ParsePullTimes(bad, 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
