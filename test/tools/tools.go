//go:build tools

// Package tools pins the Kubernetes control-plane commands that the tests build into bin/.
// It is never compiled into the operator; `make tools` runs `go build` on the packages below.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
