//go:build tools

// Package tools pins the helm command that `make tools` builds into bin/helm (the chart's lint,
// docs/install.md's commands). It is a module of its own, beside test/tools rather than in it:
// helm's dependencies would otherwise move those of the control plane that test/tools pins, and
// every bin/kube-* would be rebuilt for a helm bump.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
