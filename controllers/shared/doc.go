// Package shared holds the little that the Module side (package module) and the node side
// (package node) of kmm's controllers both need, and nothing of either (shared.go):
//
//   - how a reconcile reads the API server's answers: ConflictRetry (a reconcile that met only
//     conflicts is retried quietly, with back-off), RefusedForGood (a refusal for what the object
//     is, which a retry does not lift), IgnoreGone (a delete or patch whose target is gone or
//     changed), and PodReady;
//   - the field manager of a Module's NMC entries (FieldManager, AppliedBy), which tells kmm's
//     writes from upstream's;
//   - how kmm recognises what upstream KMM left in a cluster it takes over (docs/migration.md):
//     upstream's module name and worker labels, its device plugin pods and their finalizer.
//
// The decisions about those objects are fsm's; shared only reads and releases them.
package shared
