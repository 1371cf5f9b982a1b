// Command kmm-diagrams writes the state diagrams of the (node, module) state machine (DOT, Mermaid
// and a README) into the directory given as its argument, from the configuration in package fsm.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kmm-project/kmm/fsm"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kmm-diagrams <output directory>")
		os.Exit(2)
	}
	dir := os.Args[1]
	if err := os.MkdirAll(dir, 0o755); err != nil { //nolint:gosec // G301: documentation directory, world-readable by design
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for name, content := range fsm.DiagramFiles() {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil { //nolint:gosec // G306: documentation files are meant to be readable
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
