// Package registry decides where kmm pulls an image from and how, the way the node's container
// runtime would: containerd's hosts.toml files (config_path layout), CRI-O/podman registries.conf
// (v2), trusted CA bundles and the node's certs.d directories, and kubelet credential provider
// plugins (the credentialprovider.kubelet.k8s.io/v1 exec protocol).
//
// The decision is pure: Plan takes an image reference and parsed Settings and returns the ordered
// endpoints to try (mirrors first, then the origin unless the configuration replaces it) or an
// error when the configuration blocks the image. Load reads the files (bounded in size and count)
// into Settings; Endpoint.Options turns an endpoint into go-containerregistry remote options (TLS,
// plain HTTP, an API root other than /v2). It imports nothing of kmm's, so that both the worker
// (node side) and the operator (preflight checks) can use it. docs/registries.md lists the keys
// honoured and the bounds.
package registry
