package apipath

import "testing"

func TestParse(t *testing.T) {
	for path, want := range map[string]Path{
		"/api/v1/namespaces/kmm/pods/w-1":                                       {Namespace: "kmm", Resource: "pods", Name: "w-1"},
		"/api/v1/namespaces/kmm/pods/w-1/status":                                {Namespace: "kmm", Resource: "pods", Name: "w-1", Subresource: "status"},
		"/api/v1/namespaces/kmm/pods":                                           {Namespace: "kmm", Resource: "pods"},
		"/api/v1/nodes/n1":                                                      {Resource: "nodes", Name: "n1"},
		"/api/v1/nodes":                                                         {Resource: "nodes"},
		"/api/v1/namespaces/kmm":                                                {Resource: "namespaces", Name: "kmm"},
		"/api/v1/namespaces/kmm/secrets/cert":                                   {Namespace: "kmm", Resource: "secrets", Name: "cert"},
		"/apis/coordination.k8s.io/v1/namespaces/kmm/leases/kmm-operator":       {Namespace: "kmm", Resource: "leases", Name: "kmm-operator"},
		"/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs/n1/status":          {Resource: "nodemodulesconfigs", Name: "n1", Subresource: "status"},
		"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations": {Resource: "validatingwebhookconfigurations"},
		"/apis/authentication.k8s.io/v1/tokenreviews":                           {Resource: "tokenreviews"},
	} {
		got, ok := Parse(path)
		if !ok || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, true", path, got, ok, want)
		}
	}
	for _, path := range []string{"/healthz", "/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1", "/openapi/v2", ""} {
		if got, ok := Parse(path); ok {
			t.Errorf("Parse(%q) = %+v, true; want not an API resource path", path, got)
		}
		if r := Resource(path); r != "" {
			t.Errorf("Resource(%q) = %q, want \"\"", path, r)
		}
	}
}
