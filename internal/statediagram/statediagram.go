// Package statediagram renders the Graphviz output of a github.com/qmuntal/stateless machine as
// the diagrams kmm checks in under docs/state-diagrams/: the DOT with its edges in a stable order
// (stateless emits them in map order), and the same graph as a Mermaid state diagram read from that
// DOT, so both always show one configuration. The pair machine (fsm) and the image machine (image)
// both render through it.
package statediagram

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

var (
	edgeLine  = regexp.MustCompile(`^\t(\w+) -> (\w+) \[label=<(.*)>\];$`)
	edgeLabel = regexp.MustCompile(`<TD ALIGN="LEFT">([^<]*)</TD>`)
)

// DOT returns graph (stateless's ToGraph output) with its edge lines sorted in place; every other
// line stays where it was.
func DOT(graph string) string {
	lines := strings.Split(graph, "\n")
	var at []int
	for i, l := range lines {
		if edgeLine.MatchString(l) {
			at = append(at, i)
		}
	}
	sorted := make([]string, len(at))
	for i, j := range at {
		sorted[i] = lines[j]
	}
	sort.Strings(sorted)
	for i, j := range at {
		lines[j] = sorted[i]
	}
	return strings.Join(lines, "\n")
}

// Mermaid returns the edges of dot as a Mermaid state diagram starting in initial: one line per
// label of an edge (a trigger, with its guard when it has one).
func Mermaid(dot, initial string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "stateDiagram-v2\n    [*] --> %s\n", initial)
	for _, l := range strings.Split(dot, "\n") {
		m := edgeLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		for _, label := range edgeLabel.FindAllStringSubmatch(m[3], -1) {
			fmt.Fprintf(&b, "    %s --> %s: %s\n", m[1], m[2], label[1])
		}
	}
	return b.String()
}
