// Package build makes the build pod of one (Module, kernel) image: a one-shot pod of kmm's builder
// image (BuildKit's daemon and client, runc, and kmm's cmd/builder as its entrypoint) that builds
// the Dockerfile of a ConfigMap with BuildKit, pushes the image and reports the pushed digest, or
// the tail of the build log, in its termination message (Result). It is pure: Pod turns a Request
// into the pod, with no API client; the image controller creates it. The flag names the pod passes
// and cmd/builder reads are defined here once. docs/build.md describes the pod, docs/install.md
// ("Security") its privileges.
package build
