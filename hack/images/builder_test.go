package main

import (
	"archive/tar"
	"context"
	"path"
	"strings"
	"testing"
)

// TestBuilderImage assembles the builder image twice (stand-ins for the three Go programs, as for
// the manager: their assembly is any binary's) and checks that it is reproducible and holds what
// docs/images.md lists: the programs, the kmm-runc link, runc with its libraries, the CA bundle.
func TestBuilderImage(t *testing.T) {
	bins, _ := testImages(t)
	stand := map[string]builderBinaries{}
	for p, b := range bins {
		stand[p] = builderBinaries{Builder: b.Manager, Buildkitd: b.Manager, Buildctl: b.Manager}
	}
	unlock, err := lockDir(testDebian(t).Dir)
	if err != nil {
		t.Fatal(err)
	}
	first, err := assembleBuilder(context.Background(), testPlatforms, stand, testDebian(t), testEpoch)
	if err != nil {
		unlock()
		t.Fatal(err)
	}
	second, err := assembleBuilder(context.Background(), testPlatforms, stand, testDebian(t), testEpoch)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	d1, err := first.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d2, err := second.Digest(); err != nil || d1 != d2 {
		t.Fatalf("two assemblies: %s and %s (%v)", d1, d2, err)
	}
	for _, p := range testPlatforms {
		img := platformImage(t, first, p)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(cf.Config.Entrypoint, " "); got != "/"+builderPath || cf.Config.User != "" {
			t.Errorf("%s: entrypoint %q user %q, want /%s as root", p, got, cf.Config.User, builderPath)
		}
		files := imageFiles(t, img)
		for _, want := range []string{builderPath, buildkitdPath, buildctlPath, "usr/sbin/runc", caBundlePath} {
			if e, ok := files[want]; !ok || e.Type != tar.TypeReg {
				t.Errorf("%s: no file %s", p, want)
			}
		}
		if e := files[kmmRuncPath]; e.Type != tar.TypeSymlink || e.Link != "builder" {
			t.Errorf("%s: %s is %q → %q, want a link to builder", p, kmmRuncPath, e.Type, e.Link)
		}
		var seccomp bool
		for f := range files {
			if strings.HasPrefix(path.Base(f), "libseccomp.so.2") {
				seccomp = true
			}
			if strings.Contains(f, "bin/sh") || strings.HasSuffix(f, "/dpkg") {
				t.Errorf("%s: %s in the builder image", p, f)
			}
		}
		if !seccomp {
			t.Errorf("%s: runc's libseccomp is missing: %v", p, nonDirs(files))
		}
	}
}
