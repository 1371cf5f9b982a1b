// Package build makes the pod that builds a kmod image in the cluster from a Module's Dockerfile
// ConfigMap (issue 37): Pod turns a Request into the build pod the image controller creates.
//
// This is the image controller's minimal version of the agreed API: a pod running the builder
// image with the Dockerfile, the build arguments and the pull secret mounted. The builder helper's
// package build (BuildKit builder image, the full pod spec and its proof on a real node) replaces
// it at merge; the API (Request, Pod) is the same.
package build
