// Package controllers is the room of kmm's reconcilers, one package each, and the tests that run
// them together through the whole operator (test/testbed); it holds no code of its own.
//
//   - controllers/module is the Module side, the Module→NMC controller of seed 000: for each Module
//     and each node its selector matches, it writes the node's NodeModulesConfig spec entry
//     (server-side apply, one field manager per Module), runs the Module's device plugin DaemonSet,
//     hands the device plugin over from upstream KMM, aggregates the NMC statuses into
//     Module.status, and holds the Module's finalizer until no node has the module loaded.
//   - controllers/node is the node side, the NMC controller: per node it gathers the facts (NMC,
//     Node, worker pods, device plugin pods), runs fsm.Step for every (node, module) pair, writes
//     the NMC status once, and carries out the plans: worker pods, node labels, drains, Events.
//   - controllers/preflight checks every Module against the kernel of each PreflightValidation.
//   - controllers/shared is what the Module side and the node side both need; neither imports the
//     other (depguard: module-node-apart).
//
// The reconcilers only gather facts and execute; every decision is in fsm.
package controllers
