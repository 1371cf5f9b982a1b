// Package preflight answers, for every Module, whether it is served on a kernel the nodes do not
// run yet: whether a kernel mapping matches that kernel and the image it names exists in its
// registry for the nodes' platforms. The PreflightValidation controller (controllers/) and
// `kubectl kmm preflight` both run it, so the resource and the CLI cannot disagree.
//
// The decision is pure (Target and Decide: a Module, a kernel and what the registry said in, a
// Verdict out) and picks the kernel mapping with mapping.Resolve (internal/kernel/mapping), the
// very code the Module→NMC decision uses. Registry.Check asks the registry with one manifest HEAD (and, for an index,
// one GET of the index to find the nodes' platforms), with the Module's pull secret and its
// registryTLS settings. Run gathers the facts from the API server and runs the checks with bounded
// concurrency and a timeout per check.
package preflight
