// Package seededbug holds the seeded bugs of the chaos harness (test/chaos): faults planted in the
// operator on purpose, to show that the harness's invariant watcher catches what each kind of
// injected fault can break. None of them is in the product: each is a wrapper that the harness's
// own manager command (test/chaos/kmm-manager-seeded) installs around what the real manager
// (cmd/manager/app) is built from — its client, its cache's pod events, its leader election lock
// (through app.Options.Instrument, nil in production) or its HTTP transport — and each wrapper
// makes the mistake the bug is named after, with the same observable fault a controller making it
// itself would cause. The command plants the bugs the environment variable KMM_CHAOS_BUGS names (a
// comma-separated list); with none named it installs nothing and is cmd/manager.
package seededbug

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/cmd/manager/app"
)

// The seeded bugs, each named after what it breaks.
const (
	// ForgetCordon: cordon ownership kept in memory. A client wrapper remembers the nodes this
	// process cordoned (a merge patch setting spec.unschedulable to true) and swallows, answering
	// success, the uncordon patch of a node it did not cordon: a manager killed mid-drain leaves
	// the node cordoned, as the next process does not lift a cordon an earlier one set.
	ForgetCordon = "forget-cordon"
	// KeepLeading: the leader election lock trusts its own memory. A wrapper around the bare Lease
	// lock, under the lease fence, takes every Lease write as done once one has succeeded, answers
	// a failed read with its own record and reads another holder as itself: a replica that lost its
	// Lease (partitioned from the API server) goes on reconciling, and writing, once the partition
	// ends (the fence trusts the lock's word, so the lie passes it too).
	KeepLeading = "keep-leading"
	// ErrorAsNoPods: a failed read of the pods on a node is taken as "no pods". A transport
	// wrapper answers a list of one node's pods (a fieldSelector spec.nodeName=<node>) that failed
	// (an error answer from the API server: 429, 500, a restarting kube-apiserver or etcd; or no
	// answer) with an empty list. The NMC controller's uncached read of the workload pods a drain
	// concerns is such a list, so the module is unloaded under workload pods that still run (the
	// only other such read, of upstream KMM's device plugin pods, finds none in the harness).
	ErrorAsNoPods = "error-as-no-pods"
	// SlowCreateRenamed: a client wrapper gives a worker pod create one second; a create not
	// answered by then is taken as lost and made again at once under a fresh name (the first name
	// may be held by the create in flight): a slow API server that did create the first pod ends
	// with two worker pods for the pair.
	SlowCreateRenamed = "slow-create-renamed"
	// TombstoneIgnored: deletion expectations that miss a tombstone. A client wrapper records each
	// worker pod the manager deletes and holds back the creation of the pair's next worker pod
	// (answered AlreadyExists, which the NMC controller takes as its pod being there) until a
	// handler on the manager's pod informer sees that pod's delete event; the handler ignores a
	// deletion seen only as a tombstone (cache.DeletedFinalStateUnknown, what a relist after a cut
	// watch delivers): the expectation is never met and the pair gets no pod again.
	TombstoneIgnored = "tombstone-ignored"
	// ConflictDisownsCordon: a client wrapper reads a conflict (409) on an uncordon patch as
	// somebody else having changed the node meanwhile: it answers success and swallows every later
	// uncordon of that node, leaving the cordon to "them"; it is never lifted.
	ConflictDisownsCordon = "conflict-disowns-cordon"
	// ThrottleSkipsDPCheck: a transport wrapper answers the NMC controller's live read of a node's
	// device plugin pods before an unload (controllers/node/liveplugins.go), when it is throttled
	// with 429, with an empty list: as if none ran, so a module is unloaded under its device plugin.
	ThrottleSkipsDPCheck = "throttle-skips-dp-check"
	// StallAsNoDevicePlugin: the same live read is given 300 ms; a read that runs out of them
	// (kube-apiserver waiting for a restarting etcd) is answered with an empty list: "none".
	StallAsNoDevicePlugin = "stall-as-no-device-plugin"
	// LostAnswerAsDeleted: a client wrapper takes a worker pod DELETE whose answer did not come
	// from the API server (connection refused or reset, EOF, a gateway's 502 or 503: what a client
	// meets while the kube-apiserver it talks to restarts) as a delete that reached the server and
	// answers success; a reader wrapper hides the pod from the manager's lists of kmm's pods on its
	// node until the pod informer delivers its delete event. The pod was not deleted: no event
	// comes, nothing deletes it again, and the finished worker pod is left on the node.
	LostAnswerAsDeleted = "lost-answer-as-deleted"
)

// Bugs are all the seeded bugs.
var Bugs = []string{ForgetCordon, KeepLeading, ErrorAsNoPods, SlowCreateRenamed, TombstoneIgnored, ConflictDisownsCordon,
	ThrottleSkipsDPCheck, StallAsNoDevicePlugin, LostAnswerAsDeleted}

// EnvVar is the environment variable naming the bugs test/chaos/kmm-manager-seeded plants.
const EnvVar = "KMM_CHAOS_BUGS"

// Set is a set of planted bugs.
type Set map[string]bool

// Parse reads a comma-separated list of bug names; an unknown name is an error.
func Parse(list string) (Set, error) {
	s := Set{}
	for _, name := range strings.Split(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if !slices.Contains(Bugs, name) {
			return nil, fmt.Errorf("unknown seeded bug %q (known: %s)", name, strings.Join(Bugs, ", "))
		}
		s[name] = true
	}
	return s, nil
}

// Plant installs the wrappers of the bugs in s: on cfg's transport (ErrorAsNoPods) and, through
// o.Instrument, around the manager's client, cache and leader election lock. With s empty it
// changes nothing.
func Plant(cfg *rest.Config, o *app.Options, s Set) {
	if len(s) == 0 {
		return
	}
	if s[ErrorAsNoPods] {
		cfg.Wrap(failedListAsEmpty)
	}
	if s[ThrottleSkipsDPCheck] {
		cfg.Wrap(throttledDevicePluginListAsEmpty)
	}
	if s[StallAsNoDevicePlugin] {
		cfg.Wrap(stalledDevicePluginListAsEmpty)
	}
	m := &memory{}
	o.Instrument = func(mo *ctrl.Options) {
		if s[KeepLeading] && mo.LeaderElectionResourceLockInterface != nil {
			mo.LeaderElectionResourceLockInterface = &stubbornLock{Interface: mo.LeaderElectionResourceLockInterface}
		}
		newClient := mo.NewClient
		if newClient == nil {
			newClient = client.New
		}
		mo.NewClient = func(cfg *rest.Config, co client.Options) (client.Client, error) {
			c, err := newClient(cfg, co)
			if err != nil {
				return nil, err
			}
			return &seededClient{Client: c, bugs: s, m: m}, nil
		}
		newCache := mo.NewCache
		if newCache == nil {
			newCache = cache.New
		}
		mo.NewCache = func(cfg *rest.Config, co cache.Options) (cache.Cache, error) {
			c, err := newCache(cfg, co)
			if err != nil {
				return nil, err
			}
			return c, m.watchDeletions(c)
		}
	}
}
