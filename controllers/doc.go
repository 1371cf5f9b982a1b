// Package controllers runs the decisions of package fsm against the API server.
//
//   - ModuleReconciler is the Module→NMC controller of seed 000: for each Module and each node its
//     selector matches, it writes the node's NodeModulesConfig spec entry (server-side apply, one
//     field manager per Module, so Modules never overwrite each other's entries), runs the Module's
//     device plugin DaemonSet, aggregates the NMC statuses into Module.status, and holds the
//     Module's finalizer until no node has the module loaded.
//   - NMCReconciler is the NMC controller: per node it gathers the facts (NMC, Node, worker pods,
//     device plugin pods), runs fsm.Step for every (node, module) pair, writes the NMC status once,
//     and carries out the plans: worker pods, node labels, Events.
//
// Both reconcilers only gather facts and execute; every decision is in fsm.
package controllers
