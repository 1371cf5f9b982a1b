// Package module is the Module side of kmm: the Module→NMC controller (Reconciler) decides what
// each node should load and never reads node status.
//
// One reconcile per Module (module_controller.go, reconcile): gather every Node and NMC (the
// cache's objects), decide each node's spec entry (fsm.DecideSpec, pure), execute — apply the
// entries (through the takeover patch on an NMC upstream KMM wrote: takeover.go), write the device
// plugin DaemonSets (deviceplugin.go), hand the device plugin over from upstream (handover.go) —
// then write Module.status once (module_status.go) and release the finalizer once no node has the
// module. The status waits on the writes: it says whether they succeeded. A Module that does not
// exist has its orphaned entries removed after a grace (takeover.go).
package module
