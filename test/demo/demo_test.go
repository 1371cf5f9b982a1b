package demo

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kmm-project/kmm/test/envtest"
)

// TestDemoScenario runs the whole `make demo` walk-through and checks what it proved: every pair
// Loaded, the reboot reload, the kernel-upgrade reload with the other kernel's image, v2 on every
// node through DevicePluginDraining and Upgrading, and nothing left after deletion.
func TestDemoScenario(t *testing.T) {
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	for _, b := range []struct{ out, pkg string }{{"worker", "./cmd/worker"}, {"kubectl-kmm", "./cmd/kubectl-kmm"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v: %s", b.pkg, err, out)
		}
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	summary, err := Run(ctx, Options{WorkerBinary: filepath.Join(bin, "worker"), KubectlKMM: filepath.Join(bin, "kubectl-kmm"), Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(summary.Steps) != 5 {
		t.Fatalf("%d steps proven, want 5", len(summary.Steps))
	}
	for _, want := range []string{
		"Ready (AllLoaded), loaded on 3/3 nodes",
		"Loaded -> DevicePluginDraining -> Unloading -> Upgrading -> Loading -> Loaded",
		"loaded 127.0.0.1:", // the kernel-B image
		"every pair Absent, Module released",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the walk-through does not show %q", want)
		}
	}
}
