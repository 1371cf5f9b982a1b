// Package node is the node side of kmm: the NMC controller (NMCReconciler) decides when, per node,
// and carries it out.
//
// One reconcile per node, in four steps (nmc_controller.go, reconcile): gather the node's facts
// (its NMC, the Node, kmm's worker and device plugin pods there, the Modules), decide every pair
// with fsm.Step and the node's labels with fsm.NodeLabels, write the NMC status once, execute:
// node labels, drains (drain.go), worker pods (workerpod.go; workerregistry.go: what they pull
// with), Events and metrics (events.go). upstream.go reads what upstream KMM left on the node, only
// when the NMC holds an upstream record or a pair is about to unload; expectations.go remembers the
// pod writes the cache does not show yet; nodeevents.go lets through only the Node events that
// change what the controller reads (a kubelet's status posts do not).
package node
