package scale

import (
	"fmt"
	"hash/fnv"
	"math"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/contract"
)

// PullTimes are the simulated kubelet's image pull times for worker pods (issue 41, item 4): each
// pod runs for a time drawn from a long-tailed (log-normal) spread between Min and Max, the same
// for a pod on every call and in every run with the same Seed. The median is 2.5 Min and the
// spread's sigma 0.8: with 2–30 s, the median is 5 s, the 90th percentile about 14 s, and about
// 1 % of the pods take the longest, 30 s.
type PullTimes struct {
	Min, Max time.Duration
	Seed     int64
}

// pullSigma is the log-normal's sigma.
const pullSigma = 0.8

// ParsePullTimes reads "MIN-MAX" (e.g. "2s-30s"); empty means none.
func ParsePullTimes(s string, seed int64) (*PullTimes, error) {
	if s == "" {
		return nil, nil
	}
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return nil, fmt.Errorf("pull times %q: want MIN-MAX, e.g. 2s-30s", s)
	}
	min, err1 := time.ParseDuration(lo)
	max, err2 := time.ParseDuration(hi)
	if err1 != nil || err2 != nil || min <= 0 || max < min {
		return nil, fmt.Errorf("pull times %q: want MIN-MAX with 0 < MIN <= MAX, e.g. 2s-30s", s)
	}
	return &PullTimes{Min: min, Max: max, Seed: seed}, nil
}

// For is the run time of pod: drawn from the pod's node, Module and action, so that a pair's pull
// does not depend on the pod's generated name.
func (p PullTimes) For(pod *corev1.Pod) time.Duration {
	return p.draw(pod.Spec.NodeName + " " + pod.Labels[contract.LabelModuleNamespace] + "/" +
		pod.Labels[contract.LabelModuleName] + " " + pod.Labels[contract.LabelAction])
}

// draw maps key to a time: two uniforms from a seeded hash, Box-Muller, exp, clamped.
func (p PullTimes) draw(key string) time.Duration {
	u1, u2 := uniform(p.Seed, key, 1), uniform(p.Seed, key, 2)
	z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	d := time.Duration(float64(p.Min) * 2.5 * math.Exp(pullSigma*z))
	return min(max(d, p.Min), p.Max)
}

// uniform is a number in (0, 1) from seed, key and n.
func uniform(seed int64, key string, n int) float64 {
	h := fnv.New64a()
	_, _ = fmt.Fprintf(h, "%d %d %s", seed, n, key)
	return (float64(h.Sum64()>>11) + 0.5) / (1 << 53)
}

// Tail is how a load with pull times ended (issue 41, item 4): when the last worker pod ended and
// when every pair was Loaded, from the phase's start.
type Tail struct {
	LastPodEndedSeconds float64 `json:"lastPodEndedSeconds"`
	LoadedSeconds       float64 `json:"loadedSeconds"`
	// AfterLastPodSeconds is LoadedSeconds - LastPodEndedSeconds (target <= 2 s).
	AfterLastPodSeconds float64 `json:"afterLastPodSeconds"`
	// PullSeconds is the spread of the pods' run times as drawn.
	PullSeconds Spread `json:"pullSeconds"`
}

// tail is the Tail of a load that started at start and converged after seconds.
func (h *harness) tail(start time.Time, seconds float64) *Tail {
	t := &Tail{LoadedSeconds: seconds}
	var pulls []float64
	for _, r := range h.agent.Runs() {
		if !strings.HasPrefix(r.Node, NodePrefix) || r.Time.Before(start) {
			continue
		}
		t.LastPodEndedSeconds = max(t.LastPodEndedSeconds, r.Time.Sub(start).Seconds())
		pulls = append(pulls, h.o.PullTimes.draw(r.Node+" "+r.Module+" "+string(r.Action)).Seconds())
	}
	t.AfterLastPodSeconds = t.LoadedSeconds - t.LastPodEndedSeconds
	t.PullSeconds = spread(pulls)
	return t
}
