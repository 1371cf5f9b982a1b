// Package takeover tests changes of the NMC CRD under stored objects on a real API server: a
// takeover from upstream Kernel Module Management by kmm (kmm's CRD installed over upstream's keeps
// what upstream recorded, issue 18) and an upgrade of kmm's own NMC schema (issue 22).
package takeover
