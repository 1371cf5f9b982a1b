package image

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommittedDiagramsAreFresh fails when the image machine's files in docs/state-diagrams/
// differ from a fresh generation (run `make diagrams`).
func TestCommittedDiagramsAreFresh(t *testing.T) {
	for name, want := range DiagramFiles() {
		got, err := os.ReadFile(filepath.Join("..", "docs", "state-diagrams", name))
		if err != nil {
			t.Fatalf("%s: %v (run `make diagrams`)", name, err)
		}
		if string(got) != want {
			t.Errorf("docs/state-diagrams/%s is stale: run `make diagrams`", name)
		}
	}
}

func TestDiagramsShowEveryStateAndEdge(t *testing.T) {
	dot, mmd := DOT(), Mermaid()
	if DOT() != dot {
		t.Fatal("DOT output is not deterministic")
	}
	for _, s := range States {
		if !strings.Contains(dot, string(s)+" [label=") || StateDescriptions[s] == "" {
			t.Errorf("state %s is missing from the DOT or has no description", s)
		}
	}
	for _, e := range Edges() {
		if !strings.Contains(mmd, string(e.From)+" --> "+string(e.To)+": "+string(e.Trigger)) {
			t.Errorf("Mermaid lacks %s --%s--> %s", e.From, e.Trigger, e.To)
		}
	}
	if !strings.Contains(mmd, "[signWanted]") {
		t.Error("Mermaid does not name the guards")
	}
}
