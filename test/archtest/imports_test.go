package archtest

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kmm-project/kmm/"

// outside are the package prefixes the table leaves out: development tools (each beside the harness
// it drives, or under hack/) and tests.
var outside = []string{"test/", "hack/"}

// TestArchitectureTableMatchesGoList fails when a production package imports a kmm package the
// table does not list, lists one it no longer imports, or is missing from the table.
func TestArchitectureTableMatchesGoList(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented, err := parseTable(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	actual := goListImports(t)
	for _, problem := range compare(documented, actual) {
		t.Error(problem)
	}
}

// TestCompareCatchesEachDifference seeds the three kinds of drift and checks each is reported.
func TestCompareCatchesEachDifference(t *testing.T) {
	actual := map[string][]string{"fsm": {"api/v1beta1"}, "worker": {"contract"}}
	cases := map[string]map[string][]string{
		"undocumented import": {"fsm": {}, "worker": {"contract"}},
		"stale import":        {"fsm": {"api/v1beta1", "controllers"}, "worker": {"contract"}},
		"missing package":     {"fsm": {"api/v1beta1"}},
		"vanished package":    {"fsm": {"api/v1beta1"}, "worker": {"contract"}, "gone": {}},
	}
	for name, documented := range cases {
		if len(compare(documented, actual)) == 0 {
			t.Errorf("%s: compare found no difference", name)
		}
	}
	if p := compare(actual, actual); len(p) != 0 {
		t.Errorf("identical graphs reported as different: %v", p)
	}
}

var row = regexp.MustCompile("^\\| `([^`]+)` \\|(.*)\\|$")

// parseTable reads the rows between the imports:begin and imports:end markers.
func parseTable(doc string) (map[string][]string, error) {
	_, rest, ok := strings.Cut(doc, "<!-- imports:begin -->")
	if !ok {
		return nil, errors.New("docs/architecture.md has no <!-- imports:begin --> marker")
	}
	table, _, ok := strings.Cut(rest, "<!-- imports:end -->")
	if !ok {
		return nil, errors.New("docs/architecture.md has no <!-- imports:end --> marker")
	}
	out := map[string][]string{}
	for _, line := range strings.Split(table, "\n") {
		m := row.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		imports := []string{}
		for _, cell := range strings.Split(m[2], ",") {
			if name := strings.Trim(strings.TrimSpace(cell), "`"); name != "" {
				imports = append(imports, name)
			}
		}
		out[m[1]] = imports
	}
	if len(out) == 0 {
		return nil, errors.New("the imports table in docs/architecture.md has no rows")
	}
	return out, nil
}

// goListImports asks the go command for every package's non-test imports inside the module.
func goListImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	graph := map[string][]string{}
	dec := json.NewDecoder(bufio.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.ImportPath, module)
		if slices.ContainsFunc(outside, func(prefix string) bool { return strings.HasPrefix(name, prefix) }) {
			continue
		}
		imports := []string{}
		for _, imp := range p.Imports {
			if rel, ok := strings.CutPrefix(imp, module); ok {
				imports = append(imports, rel)
			}
		}
		graph[name] = imports
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	return graph
}

// compare lists every difference between the documented and the actual graph.
func compare(documented, actual map[string][]string) []string {
	var problems []string
	for pkg, imports := range actual {
		want, ok := documented[pkg]
		if !ok {
			problems = append(problems, "package "+pkg+" is missing from the imports table in docs/architecture.md")
			continue
		}
		for _, imp := range imports {
			if !slices.Contains(want, imp) {
				problems = append(problems, pkg+" imports "+imp+", which docs/architecture.md does not list")
			}
		}
		for _, imp := range want {
			if !slices.Contains(imports, imp) {
				problems = append(problems, "docs/architecture.md says "+pkg+" imports "+imp+", but it does not")
			}
		}
	}
	for pkg := range documented {
		if _, ok := actual[pkg]; !ok {
			problems = append(problems, "docs/architecture.md lists "+pkg+", which is not a package any more")
		}
	}
	slices.Sort(problems)
	return problems
}
