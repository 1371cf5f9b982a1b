// Package apipath reads a Kubernetes API request path (/api/v1/... and /apis/<group>/<version>/...)
// as the object it names: namespace, resource, name and subresource. It is the one home of that
// parsing for what reads requests on the wire: the lease fence (which resources a write may touch
// without the Lease), the chaos proxy and the scale harness (requests counted by resource).
package apipath

import "strings"

// Path is what an API resource path names; the fields a path does not have are empty
// (/api/v1/nodes: Resource "nodes"; /api/v1/namespaces/x: Resource "namespaces", Name "x").
type Path struct {
	Namespace, Resource, Name, Subresource string
}

// Parse reads path; false when it is not an API resource path (discovery such as /api or
// /apis/<group>/<version>, /healthz, /metrics, /openapi/v2).
func Parse(path string) (Path, bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return Path{}, false
	}
	var p Path
	if len(parts) >= 3 && parts[0] == "namespaces" {
		p.Namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 || parts[0] == "" {
		return Path{}, false
	}
	parts = append(parts, "", "")
	p.Resource, p.Name, p.Subresource = parts[0], parts[1], parts[2]
	return p, true
}

// Resource is the resource path names ("" when it names none).
func Resource(path string) string {
	p, _ := Parse(path)
	return p.Resource
}
