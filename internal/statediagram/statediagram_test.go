package statediagram

import "testing"

const graph = "digraph {\n\tcompound=true;\n" +
	"\tB -> A [label=<<TABLE BORDER=\"0\"><TR><TD ALIGN=\"LEFT\">Back</TD></TR></TABLE>>];\n" +
	"\tA -> B [label=<<TABLE BORDER=\"0\"><TR><TD ALIGN=\"LEFT\">Go [ready]</TD></TR><TR><TD ALIGN=\"LEFT\">Also</TD></TR></TABLE>>];\n" +
	"\tA [label=\"A\"];\n}"

func TestDOTSortsEdgesInPlace(t *testing.T) {
	want := "digraph {\n\tcompound=true;\n" +
		"\tA -> B [label=<<TABLE BORDER=\"0\"><TR><TD ALIGN=\"LEFT\">Go [ready]</TD></TR><TR><TD ALIGN=\"LEFT\">Also</TD></TR></TABLE>>];\n" +
		"\tB -> A [label=<<TABLE BORDER=\"0\"><TR><TD ALIGN=\"LEFT\">Back</TD></TR></TABLE>>];\n" +
		"\tA [label=\"A\"];\n}"
	if got := DOT(graph); got != want {
		t.Errorf("DOT:\n%s\nwant:\n%s", got, want)
	}
}

func TestMermaidHasALinePerLabel(t *testing.T) {
	want := "stateDiagram-v2\n    [*] --> A\n" +
		"    A --> B: Go [ready]\n    A --> B: Also\n    B --> A: Back\n"
	if got := Mermaid(DOT(graph), "A"); got != want {
		t.Errorf("Mermaid:\n%s\nwant:\n%s", got, want)
	}
}
