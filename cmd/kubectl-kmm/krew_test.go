package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// krewManifest is the part of krew's Plugin (krew.googlecontainertools.github.com/v1alpha2) the
// test checks.
type krewManifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Caveats          string `json:"caveats"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestKrewManifest checks hack/krew/kmm.yaml: a Plugin named kmm (kubectl kmm) whose every
// platform installs the kubectl-kmm binary from the archive hack/krew/package.sh names for it, with
// the VERSION and SHA256 placeholders package.sh fills in; linux and darwin on amd64 and arm64,
// each once.
func TestKrewManifest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "hack", "krew", "kmm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m krewManifest
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		t.Fatalf("hack/krew/kmm.yaml has a field krew does not know (or is not YAML): %v", err)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "kmm" {
		t.Errorf("not krew's Plugin kmm: %s %s %s", m.APIVersion, m.Kind, m.Metadata.Name)
	}
	if m.Spec.Version != "VERSION" || m.Spec.Homepage == "" || m.Spec.ShortDescription == "" || m.Spec.Description == "" {
		t.Errorf("spec: version %q (want the VERSION placeholder), homepage, shortDescription and description set: %+v", m.Spec.Version, m.Spec)
	}
	want := map[string]bool{"linux/amd64": true, "linux/arm64": true, "darwin/amd64": true, "darwin/arm64": true}
	for _, p := range m.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		key := os + "/" + arch
		if !want[key] {
			t.Errorf("platform %s: unexpected or listed twice", key)
		}
		delete(want, key)
		uri := fmt.Sprintf("https://github.com/kmm-project/kmm/releases/download/VERSION/kubectl-kmm_%s_%s.tar.gz", os, arch)
		if p.URI != uri || p.SHA256 != "SHA256" || p.Bin != "kubectl-kmm" || len(p.Files) != 1 || p.Files[0].From != "kubectl-kmm" {
			t.Errorf("platform %s: uri %s (want %s), sha256 %s, bin %s, files %+v", key, p.URI, uri, p.SHA256, p.Bin, p.Files)
		}
	}
	for key := range want {
		t.Errorf("platform %s missing", key)
	}
}
