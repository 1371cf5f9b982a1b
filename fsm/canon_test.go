package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// The canonical form of a model world, for the explorer's deduplication: two worlds with the same
// form behave alike under every action from here on, so only one is explored.
//
// What it leaves out or abstracts, and why that is sound:
//   - the clock: times are written relative to now, and times older than timeHorizon (beyond the
//     longest delay any decision or property counts, so every deadline from them is past) by their
//     order among such times only (the Ready transition is compared with the last worker run);
//   - boot IDs: by how many boots ago they were (they are only compared for equality);
//   - UIDs and resourceVersions: only whether a cached copy has the current one (that is all the
//     preconditions compare);
//   - transition logs: checked in every state they are written in (invariant 8), and never read
//     by a decision, so two logs that differ change nothing that follows;
//   - the cache: only the stale contents, as the current one is the world itself.

// timeHorizon is beyond every delay of modelDelays.
const timeHorizon = 8 * time.Minute

// stateHash is a world's canonical form, hashed.
type stateHash [16]byte

type canon struct {
	b    []byte
	now  time.Time
	olds []int // positions of times older than the horizon, to rewrite as ranks
}

func (c *canon) str(s string) {
	c.b = strconv.AppendInt(c.b, int64(len(s)), 10)
	c.b = append(c.b, ':')
	c.b = append(c.b, s...)
}

func (c *canon) num(n int64) {
	c.b = strconv.AppendInt(c.b, n, 10)
	c.b = append(c.b, ',')
}

func (c *canon) flag(v bool) {
	if v {
		c.b = append(c.b, 'T')
	} else {
		c.b = append(c.b, 'F')
	}
}

func (c *canon) time(t time.Time) {
	switch off := t.Sub(c.now); {
	case t.IsZero():
		c.b = append(c.b, 'z')
	case off >= -timeHorizon:
		c.b = append(c.b, 't')
		c.num(int64(off / time.Second))
	default:
		c.b = append(c.b, 'o')
		c.olds = append(c.olds, len(c.b))
		c.b = binary.BigEndian.AppendUint64(c.b, uint64(t.Unix()))
	}
}

// boot writes a boot ID of node as how many boots ago it was.
func (c *canon) boot(sn *simNode, id string) {
	if id == "" {
		c.b = append(c.b, '-')
		return
	}
	n, err := strconv.Atoi(id)
	if err != nil {
		c.str(id)
		return
	}
	c.num(int64(sn.boot - n))
}

func (c *canon) config(cfg *kmmv1beta1.ModuleConfig) {
	if cfg == nil {
		c.b = append(c.b, 'n')
		return
	}
	c.str(cfg.ContainerImage)
	c.str(cfg.KernelVersion)
	c.str(cfg.Version)
	c.str(cfg.Modprobe.FirmwarePath)
}

func (c *canon) status(sn *simNode, st *kmmv1beta1.NodeModuleStatus) {
	c.str(string(st.State))
	c.boot(sn, st.UpstreamBootID)
	c.str(st.Version)
	c.str(st.Reason)
	c.str(st.Message)
	c.num(int64(st.Attempts))
	c.config(st.Config)
	c.boot(sn, st.BootID)
	c.str(st.ImageDigest)
	c.time(st.LastTransitionTime.Time)
	if st.LastWorkerTime != nil {
		c.time(st.LastWorkerTime.Time)
	} else {
		c.b = append(c.b, 'n')
	}
	if d := st.Drain; d != nil {
		c.time(d.StartTime.Time)
		c.str(d.LastStrategy)
		c.flag(d.CordonedByKMM)
	} else {
		c.b = append(c.b, 'n')
	}
}

func (c *canon) nmc(w *world, node string, nmc *simNMC) {
	sn := w.nodes[node]
	sortedRange(nmc.spec, func(key string, e kmmv1beta1.NodeModuleSpec) {
		c.str(key)
		c.config(&e.Config)
	})
	c.b = append(c.b, '|')
	sortedRange(nmc.status, func(key string, st kmmv1beta1.NodeModuleStatus) {
		c.str(key)
		c.status(sn, &st)
	})
	c.b = append(c.b, '|')
}

func (c *canon) pod(w *world, p *simPod) {
	sn := w.nodes[p.node]
	c.str(p.name)
	c.str(string(p.action))
	c.num(int64(p.attempt))
	c.config(&p.entry.Config)
	c.str(string(p.phase))
	c.boot(sn, p.result.BootID)
	c.str(p.result.ImageDigest)
	c.str(string(p.result.Reason))
	c.str(p.result.Message)
	c.time(p.created)
}

// hash returns the world's canonical form, hashed.
func (w *world) hash() stateHash {
	c := &canon{b: make([]byte, 0, 2048), now: w.now}
	for _, n := range w.cfg.nodes {
		sn := w.nodes[n]
		c.str(n)
		sortedRange(sn.labels, func(k, v string) {
			c.str(k)
			c.str(v)
		})
		c.flag(sn.ready)
		c.flag(sn.cordoned)
		c.str(sn.kernel)
		c.time(sn.readySince)
		sortedRange(sn.loaded, func(k string, cfg kmmv1beta1.ModuleConfig) {
			c.str(k)
			c.config(&cfg)
		})
		c.str(w.kmmCordon[n])
		if wl := w.workloads[n]; wl != nil {
			c.flag(wl.pdb)
			c.flag(wl.finalizer)
			c.flag(wl.terminating)
		} else {
			c.b = append(c.b, 'n')
		}
		c.nmc(w, n, w.nmcs[n])
	}
	for _, key := range w.cfg.modules {
		sm := w.modules[key]
		c.flag(sm.exists)
		c.num(int64(sm.gen))
		c.str(sm.version)
		c.str(sm.broken)
	}
	sortedRange(w.pods, func(_ string, p *simPod) {
		c.pod(w, p)
		c.flag(p.hung)
	})
	sortedRange(w.dpPods, func(k string, _ bool) { c.str(k) })
	c.b = append(c.b, '|')
	sortedRange(w.claims, func(k string, _ bool) { c.str(k) })
	c.b = append(c.b, '|')
	sortedRange(w.unhooked, func(k string, v bool) {
		c.str(k)
		c.flag(v)
	})
	c.b = append(c.b, '#')
	for _, s := range w.history[:len(w.history)-1] {
		for _, n := range w.cfg.nodes {
			nmc := s.nmcs[n]
			if nmc.rv == w.nmcs[n].rv {
				c.b = append(c.b, '=') // the same resourceVersion: the same content as now
				continue
			}
			c.nmc(w, n, &nmc)
		}
		sortedRange(s.pods, func(name string, p simPod) {
			cur, ok := w.pods[name]
			c.flag(ok && cur.uid == p.uid)
			c.pod(w, &p)
		})
		c.b = append(c.b, '#')
	}
	c.flag(w.conflict)
	c.flag(w.refuse)
	c.flag(w.refuseNode)
	sortedRange(w.attempts, func(k string, r *attemptRecord) {
		c.str(k)
		c.str(string(r.action))
		c.config(&r.config)
		c.time(r.failed)
		c.num(int64(r.streak))
	})
	sortedRange(w.refused, func(k string, r CreateRefusal) {
		c.str(k)
		c.str(string(r.Action))
		c.num(int64(r.Attempt))
		c.str(r.Message)
	})
	c.rankOlds()
	sum := sha256.Sum256(c.b)
	return stateHash(sum[:16])
}

// fingerprint is what settling changes, without the clock: when a round leaves it alone, the
// world has settled.
func (w *world) fingerprint() string {
	c := &canon{b: make([]byte, 0, 512)}
	for _, n := range w.cfg.nodes {
		sn := w.nodes[n]
		sortedRange(sn.labels, func(k, v string) {
			c.str(k)
			c.str(v)
		})
		c.num(int64(w.nmcs[n].rv))
		c.num(int64(len(sn.loaded)))
		c.flag(sn.cordoned)
		if wl := w.workloads[n]; wl != nil {
			c.flag(wl.terminating)
		} else {
			c.b = append(c.b, 'n')
		}
	}
	sortedRange(w.pods, func(name string, p *simPod) {
		c.str(name)
		c.num(int64(p.uid))
		c.str(string(p.phase))
	})
	c.num(int64(len(w.dpPods)))
	c.num(int64(len(w.claims)))
	return string(c.b)
}

// sortedRange calls f for each entry of m, in the order of the keys.
func sortedRange[V any](m map[string]V, f func(string, V)) {
	var buf [16]string
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f(k, m[k])
	}
}

// rankOlds rewrites each time older than the horizon as its rank among them.
func (c *canon) rankOlds() {
	if len(c.olds) == 0 {
		return
	}
	vals := make([]uint64, len(c.olds))
	for i, pos := range c.olds {
		vals[i] = binary.BigEndian.Uint64(c.b[pos:])
	}
	distinct := slices.Compact(slices.Sorted(slices.Values(vals)))
	for i, pos := range c.olds {
		rank, _ := slices.BinarySearch(distinct, vals[i])
		binary.BigEndian.PutUint64(c.b[pos:], uint64(rank))
	}
}
