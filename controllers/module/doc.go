// Package module is the Module side of kmm: the Module→NMC controller (Reconciler) decides what
// each node should load and never reads node status.
//
// One reconcile per Module: gather every Node and NMC (the cache's objects), decide each node's
// spec entry (fsm.DecideSpec, pure), execute (apply the entries — specs.go, through the takeover
// patch on an NMC upstream KMM wrote — takeover.go; the device plugin DaemonSets — deviceplugin.go;
// the handover of upstream's device plugin — handover.go), then write Module.status once
// (module_status.go) and release the finalizer once no node has the module. A Module that does
// not exist has its orphaned entries removed after a grace (orphans.go). What wakes it is in
// watches.go.
package module
