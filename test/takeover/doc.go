// Package takeover tests changes of the NMC CRD under stored objects on a real API server: a
// switch from upstream Kernel Module Management to kmm (kmm's CRD installed over upstream's keeps
// what upstream recorded, issue 18) and an upgrade of kmm's own NMC schema (issue 22).
package takeover
