// Package e2e brings up a real Kubernetes cluster on this machine for the end-to-end tests of
// `make e2e`: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built into bin/,
// and one real node, a kubelet on containerd and runc with a CNI bridge, pulling from an
// in-process OCI registry on 127.0.0.1. Everything lives in one folder of the test; what the node
// changes on the host (sysctls, cgroups, mounts, links, host paths) is recorded at Start and undone
// by Stop, or by the cleanup command when the test died. docs/e2e.md describes the cluster, its host
// side effects and its timings.
//
// The package itself starts nothing when imported or tested with `go test ./...`: its tests carry
// the build tag e2e.
package e2e
