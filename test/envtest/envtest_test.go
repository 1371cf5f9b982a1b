package envtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAssetsDirNamesTheMakeTargetWhenBinariesAreMissing(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", empty)
	_, err := AssetsDir("/repo")
	if err == nil || !strings.Contains(err.Error(), "run `make tools`") || !strings.Contains(err.Error(), empty) {
		t.Fatalf("AssetsDir = %v, want an error naming %s and `make tools`", err, empty)
	}
}

func TestAssetsDirDefaultsToTheRepositoryBin(t *testing.T) {
	root := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", "")
	bin := filepath.Join(root, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if err := os.WriteFile(filepath.Join(bin, b), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := AssetsDir(root)
	if err != nil || dir != bin {
		t.Fatalf("AssetsDir = %q, %v; want %q", dir, err, bin)
	}
}

func TestRepoRootFindsTheModule(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "config", "crd", "bases")); err != nil {
		t.Fatalf("RepoRoot() = %s, which has no config/crd/bases", root)
	}
}
