package main

import (
	"testing"
	"time"
)

// TestRelistPauseResetsAfterAHealthyWatch: pauses grow while watches expire at once, and fall back
// to the first after a watch that ran longer than the longest pause (the seeded fault, a back-off
// never reset, keeps 30 s pauses for the rest of the session).
func TestRelistPauseResetsAfterAHealthyWatch(t *testing.T) {
	b := relistBackOff
	var grown time.Duration
	for range 8 {
		grown = relistPause(&b, time.Millisecond)
	}
	if grown < 20*time.Second {
		t.Fatalf("after 8 expiries in a row the pause is %v, want it grown towards %v", grown, relistBackOff.Cap)
	}
	first := relistPause(&b, relistBackOff.Cap+time.Second)
	if first > 2*relistBackOff.Duration {
		t.Fatalf("after a watch that ran %v the pause is %v, want about %v", relistBackOff.Cap+time.Second, first, relistBackOff.Duration)
	}
}
