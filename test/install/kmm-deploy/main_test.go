package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/install"
)

// TestRenderSetsBothImages runs `kmm-deploy render` as `make deploy` calls apply: the images given
// end up as the operator's container image and as the worker image it runs.
func TestRenderSetsBothImages(t *testing.T) {
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kustomize, err := install.Kustomize(root)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(context.Background(), []string{"render", "--kustomize", kustomize,
		"--image", "kmm-manager=127.0.0.1:5000/kmm-manager:v9", "--image", "kmm-worker=127.0.0.1:5000/kmm-worker:v9",
		filepath.Join(root, "config", "default")}, &out)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Decode(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	d := install.Find(objs, "Deployment", "kmm-controller-manager")
	args, err := install.ContainerArgs(d, "manager")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "image: 127.0.0.1:5000/kmm-manager:v9") || !slices.Contains(args, "--worker-image=127.0.0.1:5000/kmm-worker:v9") {
		t.Fatalf("images not set: args %q", args)
	}
}

func TestRunRejectsBadUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"install"}, {"apply", "a", "b"}} {
		if err := run(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
