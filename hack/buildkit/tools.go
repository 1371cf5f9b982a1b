//go:build tools

// Package buildkit pins BuildKit's daemon and client, built from Go source into kmm's builder image
// by `go run ./hack/images build` (docs/images.md). A module of its own: BuildKit's dependencies
// must not move the operator's, nor the tools module's (kubelet, etcd).
package buildkit

import (
	_ "github.com/moby/buildkit/cmd/buildctl"
	_ "github.com/moby/buildkit/cmd/buildkitd"
)
