package chaos

import (
	"maps"
	"sort"
	"sync"
)

// The fault kinds the injector counts.
const (
	FaultKill             = "manager-kill"      // SIGKILL of a manager replica, restarted at once
	FaultPartition        = "partition"         // the leader's traffic stopped until it lost its Lease
	FaultAPIServerRestart = "apiserver-restart" // kube-apiserver killed and started again
	FaultEtcdRestart      = "etcd-restart"      // etcd killed and started again (same data dir)
	FaultWatchCut         = "watch-cut"         // one watch stream of a replica cut by its proxy
	FaultThrottle         = "http-429"          // a request answered 429 by the proxy
	FaultServerError      = "http-500"          // a request answered 500 by the proxy
	FaultConflict         = "http-409"          // an update answered 409 by the proxy
	FaultDelay            = "delay"             // a request held back before it is forwarded
)

// FaultKinds are every kind, in report order.
var FaultKinds = []string{FaultKill, FaultPartition, FaultAPIServerRestart, FaultEtcdRestart, FaultWatchCut,
	FaultThrottle, FaultServerError, FaultConflict, FaultDelay}

// faultCounts counts the faults injected, by kind, and by the phase of the round they fell in.
type faultCounts struct {
	mu      sync.Mutex
	n       map[string]int
	phase   string
	byPhase map[string]map[string]int
	// byClass are the request faults by kind, then by the class of the request (watch, read, write).
	byClass map[string]map[string]int
}

func newFaultCounts() *faultCounts {
	return &faultCounts{n: map[string]int{}, byPhase: map[string]map[string]int{}, byClass: map[string]map[string]int{}}
}

// setPhase names the phase the next faults fall in ("" between rounds).
func (c *faultCounts) setPhase(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.phase = p
}

func (c *faultCounts) add(kind string) { c.addN(kind, 1) }

// addRequest counts one request fault of kind on a request of class.
func (c *faultCounts) addRequest(kind, class string) {
	c.addN(kind, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byClass[kind] == nil {
		c.byClass[kind] = map[string]int{}
	}
	c.byClass[kind][class]++
}

func (c *faultCounts) addN(kind string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[kind] += n
	p := c.phase
	if p == "" {
		p = "between rounds"
	}
	if c.byPhase[p] == nil {
		c.byPhase[p] = map[string]int{}
	}
	c.byPhase[p][kind] += n
}

func (c *faultCounts) phases() map[string]map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneNested(c.byPhase)
}

func (c *faultCounts) classes() map[string]map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneNested(c.byClass)
}

func cloneNested(in map[string]map[string]int) map[string]map[string]int {
	out := make(map[string]map[string]int, len(in))
	for p, m := range in {
		out[p] = maps.Clone(m)
	}
	return out
}

func (c *faultCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// sortedKeys are m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
