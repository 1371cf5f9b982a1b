// Package preflight is the PreflightValidation controller (Reconciler): it checks every
// Module against the kernel of each PreflightValidation with the checks of package
// github.com/kmm-project/kmm/preflight (imported under its own name, preflight) and writes the
// verdicts to its status.
package preflight
