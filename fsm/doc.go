// Package fsm is the decision core of kmm: the state machine of one (node, module) pair and the two
// pure decisions of seed 000 that drive it.
//
//   - DecideSpec is the Module→NMC decision: from a Module and a node's labels and kernel (never its
//     status), whether the node's NodeModulesConfig spec should hold an entry for the Module, and which.
//     The selector and the kernel mapping are read by internal/kernel/mapping, which the preflight
//     shares.
//   - Step is the NMC decision: from one pair's observed facts (spec entry, status entry, node
//     readiness, kernel and boot ID, the worker pod, the device plugin pod, the time), which triggers
//     fire on the state machine, the new status entry, and the Plan of side effects the reconciler
//     carries out while the pair is in its state.
//
// The machine is built once on github.com/qmuntal/stateless (Machine), with its state stored
// externally in the status entry. Nothing here talks to the API server or reads the clock: time is
// a fact. docs/state-diagrams/ is generated from Machine.
package fsm
