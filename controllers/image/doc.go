// Package image is the image controller of issue 37: per Module with a build or sign recipe it
// keeps the Module's ModuleImagesConfig (one spec entry per image the Module's selected nodes need)
// and runs the pure (Module, image) state machine of package github.com/kmm-project/kmm/image on
// each entry. It gathers the facts (the registry's answer, the build and sign pods, the recipe's
// ConfigMap and Secrets), writes the MIC status once per reconcile, then creates or deletes build
// and sign pods and records one Event per failure. The Module side reads the MIC status to hold
// back the NMC entries of images that are not Present yet (docs/build.md).
package image
