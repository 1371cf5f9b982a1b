// Command cleanup undoes what an e2e cluster did to the host when its test died without Stop
// (`go test -timeout` ends the test binary without running deferred functions): `make e2e` runs it
// from a shell trap on the cluster's folder. It stops the cluster's daemons and pods, unmounts,
// removes cgroups and links, restores sysctls and removes the host paths the cluster created, from
// the record Start wrote; it does nothing on a folder without one.
package main

import (
	"fmt"
	"os"

	"github.com/kmm-project/kmm/test/e2e"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: e2e-cleanup DIR")
		os.Exit(2)
	}
	if err := e2e.Cleanup(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "e2e-cleanup:", err)
		os.Exit(1)
	}
}
