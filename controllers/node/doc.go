// Package node is the node side of kmm: the NMC controller (NMCReconciler) decides when, per node,
// and carries it out.
//
// One reconcile per node, in four steps (nmc_controller.go, reconcile): gather the node's facts
// (its NMC, the Node, kmm's worker and device plugin pods there, the Modules; upstream KMM's pods
// only when the NMC holds an upstream record — upstream.go), decide every pair with fsm.Step and
// the node's labels with fsm.NodeLabels (decide.go), write the NMC status once, execute: node
// labels, drains (drain.go), worker pods (workerpod.go, workerregistry.go, sapullsecrets.go),
// Events and metrics (events.go, metrics.go). expectations.go remembers the pod writes the cache
// does not show yet. chaosbug.go holds test/chaos's seeded bugs (off without -tags chaosbugs).
package node
