// Package image decides the life of one (Module, image): whether the kmod image a Module's nodes
// need is in its registry, and if not, whether to build it, sign it, or wait for it. Like fsm it is
// pure — facts in (the registry's answer, the build and sign pods, the recipe, the rebuild trigger,
// the previous status entry, the time), decisions out (the new status entry and the plan: check the
// registry, create a build or sign pod, delete finished pods, requeue after a back-off) — with no
// API client and no clock. The state machine is built on github.com/qmuntal/stateless from one
// table of edges (Edges) and stores its state outside itself, in the ModuleImagesConfig status
// entry of the image. MayLoad is the gate the pair machine asks before a pair loads the image.
// docs/build.md describes the machine and the properties its tests check.
package image
