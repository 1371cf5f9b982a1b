// Command kmm-bundle writes kmm's OLM bundle (make bundle) and validates it with
// operator-framework's own validation library (github.com/operator-framework/api, the version
// the Go module proxy serves: v0.9.1). It is a module of its own: that version pins Kubernetes
// v0.20 libraries, which the operator's module must not be moved to.
//
//	kustomize build config/default | kmm-bundle generate <bundle directory>
//	kmm-bundle validate <bundle directory>
//
// generate turns the objects config/default renders (controller-gen's CRDs, RBAC and webhook
// configuration among them) into a ClusterServiceVersion: the owned CRDs, the Deployment as its
// install strategy with OLM providing the webhook certificate (--cert-management=none), the
// Role's and ClusterRoles' rules as permissions, the webhooks as webhook definitions, and the
// install modes (AllNamespaces only: kmm is cluster-wide). docs/install.md, "OLM bundle".
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "generate" && os.Args[1] != "validate") {
		fmt.Fprintln(os.Stderr, "usage: kustomize build config/default | kmm-bundle generate <dir>; kmm-bundle validate <dir>")
		os.Exit(2)
	}
	var err error
	if os.Args[1] == "generate" {
		err = generate(os.Stdin, os.Args[2])
	} else {
		err = validate(os.Args[2], os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kmm-bundle:", err)
		os.Exit(1)
	}
}
