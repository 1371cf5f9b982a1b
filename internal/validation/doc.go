// Package validation holds the rules a Module and a worker's ModuleConfig must follow beyond what the
// CRD schema expresses: regular expressions and version ranges compile within kmm's bounds, image
// references parse with a tag or digest, the name budget of versioned Modules, and the config a
// worker can act on, the bounds of build and sign recipes. The admission webhook (Admission), the
// Module controller's re-check (Module: the same rules, for an object that got in anyway), the NMC controller (before it creates a worker pod) and the worker itself call
// these same functions. It sits above
// api/v1beta1 and internal/kernel so that the API types import nothing of kmm's.
package validation
