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
)

// Bugs are all the seeded bugs.
var Bugs = []string{ForgetCordon, KeepLeading, ErrorAsNoPods}
