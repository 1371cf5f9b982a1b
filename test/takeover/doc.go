// Package takeover tests a switch from upstream Kernel Module Management to kmm on a real API
// server: kmm's NMC CRD installed over upstream's keeps what upstream recorded (issue 18).
package takeover
