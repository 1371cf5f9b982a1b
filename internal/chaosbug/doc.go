// Package chaosbug holds the seeded bugs of the chaos harness (test/chaos): faults planted in the
// operator on purpose, to show that the harness's invariant watcher catches what each kind of
// injected fault can break. They exist only in a manager built with the build tag `chaosbugs`
// (test/chaos builds one for its seeded-bug tests) and are chosen there by the environment
// variable KMM_CHAOS_BUGS (a comma-separated list of bug names). In every other build Enabled is
// the constant false: the hooks compile away and no environment variable is read.
package chaosbug

// The seeded bugs, each named after what it breaks.
const (
	// ForgetCordon: the NMC controller does not lift a cordon kmm set before the process started
	// (cordon ownership kept in memory): a manager killed mid-drain leaves the node cordoned.
	ForgetCordon = "forget-cordon"
	// KeepLeading: the leader election lock trusts its own memory: a replica that lost its Lease
	// (partitioned from the API server) goes on reconciling, and writing, once the partition ends.
	KeepLeading = "keep-leading"
	// ErrorAsNoPods: a failed read of the workload pods a drain concerns (an error answer from the
	// API server: 429, 500, a restarting kube-apiserver or etcd) is taken as "no pods left", so the
	// module is unloaded under workload pods that still run.
	ErrorAsNoPods = "error-as-no-pods"
	// SlowCreateRenamed: a worker pod create not answered within a second is taken as lost and made
	// again at once under a fresh name (the first name may be held by the create in flight): a slow
	// API server that did create the first pod ends with two worker pods for the pair.
	SlowCreateRenamed = "slow-create-renamed"
	// TombstoneIgnored: the NMC controller waits for the delete event of each worker pod it deleted
	// before it creates the pair's next one (deletion expectations), and its handler ignores a
	// deletion seen only as a tombstone (cache.DeletedFinalStateUnknown, what a relist after a cut
	// watch delivers): the expectation is never met and the pair gets no pod again.
	TombstoneIgnored = "tombstone-ignored"
	// ConflictDisownsCordon: a conflict (409) on kmm's uncordon is read as somebody else having
	// changed the node meanwhile, so kmm leaves the cordon to them and never lifts it.
	ConflictDisownsCordon = "conflict-disowns-cordon"
	// ThrottleSkipsDPCheck: the NMC controller reads the node's device plugin pods live (not to wait
	// on its cache); a read throttled with 429 skips the check, as if no device plugin pod ran, so a
	// module is unloaded under its device plugin.
	ThrottleSkipsDPCheck = "throttle-skips-dp-check"
	// StallAsNoDevicePlugin: the same live read of the device plugin pods is given 300 ms; a read
	// that runs out of them (kube-apiserver waiting for a restarting etcd) is taken as "none".
	StallAsNoDevicePlugin = "stall-as-no-device-plugin"
	// LostAnswerAsDeleted: a worker pod DELETE whose answer did not come from the API server
	// (connection refused or reset, EOF, a gateway's 502 or 503: what a client meets while the
	// kube-apiserver it talks to restarts) is taken as a delete that reached the server, so the pod
	// is struck from the NMC controller's view until its delete event. The pod was not deleted: no
	// event comes, nothing deletes it again, and the finished worker pod is left on the node.
	LostAnswerAsDeleted = "lost-answer-as-deleted"
)

// Bugs are all the seeded bugs.
var Bugs = []string{ForgetCordon, KeepLeading, ErrorAsNoPods, SlowCreateRenamed, TombstoneIgnored, ConflictDisownsCordon,
	ThrottleSkipsDPCheck, StallAsNoDevicePlugin, LostAnswerAsDeleted}
