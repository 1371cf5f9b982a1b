// Command kmm-diagrams writes the state diagrams of kmm's state machines — the (node, module) pair
// machine of package fsm and the (Module, image) machine of package image — as DOT, Mermaid and
// Markdown into the directory given as its argument, from the machines' own configuration.
package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"

	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/image"
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
	files := fsm.DiagramFiles()
	maps.Copy(files, image.DiagramFiles())
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil { //nolint:gosec // G306: documentation files are meant to be readable
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
