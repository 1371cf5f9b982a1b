package chaos

import (
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

// faultCounts counts the faults injected, by kind.
type faultCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func newFaultCounts() *faultCounts { return &faultCounts{n: map[string]int{}} }

func (c *faultCounts) add(kind string) { c.addN(kind, 1) }

func (c *faultCounts) addN(kind string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[kind] += n
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
