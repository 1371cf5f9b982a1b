package main

import (
	"archive/tar"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The builder image (kmm-builder): the one-shot BuildKit build pod of package build.
const (
	builderName   = "kmm-builder"
	builderPath   = "usr/local/bin/builder"
	buildkitdPath = "usr/local/bin/buildkitd"
	buildctlPath  = "usr/local/bin/buildctl"
	// kmmRuncPath is a link to the builder, which runs as runc --rootless=true under that name
	// (cmd/builder: the runc of an unprivileged build pod).
	kmmRuncPath = "usr/local/bin/kmm-runc"
	// buildkitModule is the Go module that pins BuildKit (hack/buildkit), apart from kmm's.
	buildkitModule = "hack/buildkit"
)

// runcPrograms: BuildKit's OCI worker runs runc from PATH; Debian's runc package puts it in
// /usr/sbin (and a link in /usr/bin).
var runcPrograms = []string{"usr/sbin/runc"}

// builderBinaries are the builder image's Go programs for one platform.
type builderBinaries struct {
	Builder, Buildkitd, Buildctl string
}

// goBuildBuilder builds ./cmd/builder of the module at repo, and BuildKit's buildkitd and buildctl
// from the hack/buildkit module, for p into <cache>/go/<arch>/, static and reproducible.
func goBuildBuilder(ctx context.Context, repo string, p platform, cache string) (builderBinaries, error) {
	dir, err := filepath.Abs(filepath.Join(cache, "go", p.GOARCH))
	if err != nil {
		return builderBinaries{}, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return builderBinaries{}, err
	}
	for _, b := range []struct {
		dir  string
		pkgs []string
	}{
		{repo, []string{"./cmd/builder"}},
		{filepath.Join(repo, buildkitModule), []string{"github.com/moby/buildkit/cmd/buildkitd", "github.com/moby/buildkit/cmd/buildctl"}},
	} {
		args := append([]string{"build"}, goBuildFlags...)
		args = append(append(args, "-o", dir+"/"), b.pkgs...)
		cmd := exec.CommandContext(ctx, "go", args...) // #nosec G204 -- go build with our flags and packages
		cmd.Dir = b.dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+p.GOARCH)
		if out, err := cmd.CombinedOutput(); err != nil {
			return builderBinaries{}, fmt.Errorf("go build %v for %s: %w\n%s", b.pkgs, p, err, out)
		}
	}
	return builderBinaries{Builder: filepath.Join(dir, "builder"), Buildkitd: filepath.Join(dir, "buildkitd"),
		Buildctl: filepath.Join(dir, "buildctl")}, nil
}

// assembleBuilder builds the builder image index:
//
//	layer 1 the CA bundle (the same blob as the other images'); layer 2 runc with its libraries
//	and loader from Debian; layer 3 buildkitd and buildctl; layer 4 /usr/local/bin/builder and
//	the link /usr/local/bin/kmm-runc to it
func assembleBuilder(ctx context.Context, platforms []platform, bins map[string]builderBinaries, deb *debian, epoch time.Time) (v1.ImageIndex, error) {
	ca, err := deb.caBundle(ctx, platforms[0])
	if err != nil {
		return nil, err
	}
	caLayer, err := layer(map[string]*node{caBundlePath: {Type: tar.TypeReg, Mode: 0o644, Data: ca}}, epoch)
	if err != nil {
		return nil, err
	}
	imgs := make([]v1.Image, 0, len(platforms))
	for _, p := range platforms {
		b, ok := bins[p.String()]
		if !ok {
			return nil, fmt.Errorf("no builder binaries for %s", p)
		}
		img, err := builderImage(ctx, p, b, deb, epoch, namedLayer{caLayer, "/" + caBundlePath + " from Debian's ca-certificates"})
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	return index(imgs, platforms), nil
}

func builderImage(ctx context.Context, p platform, b builderBinaries, deb *debian, epoch time.Time, ca namedLayer) (v1.Image, error) {
	t, c, err := deb.programFiles(ctx, p, []string{"runc"}, runcPrograms)
	if err != nil {
		return nil, err
	}
	runc := map[string]*node{}
	for _, k := range c.Keys {
		runc[k] = t[k]
	}
	runcLayer, err := layer(runc, epoch)
	if err != nil {
		return nil, err
	}
	bk := map[string]*node{}
	for path, file := range map[string]string{buildkitdPath: b.Buildkitd, buildctlPath: b.Buildctl} {
		if bk[path], err = staticBinary(file, p); err != nil {
			return nil, err
		}
	}
	bkLayer, err := layer(bk, epoch)
	if err != nil {
		return nil, err
	}
	builder, err := staticBinary(b.Builder, p)
	if err != nil {
		return nil, err
	}
	builderLayer, err := layer(map[string]*node{builderPath: builder, kmmRuncPath: {Type: tar.TypeSymlink, Link: "builder"}}, epoch)
	if err != nil {
		return nil, err
	}
	return image(p, epoch, v1.Config{Entrypoint: []string{"/" + builderPath}, Env: []string{defaultPath}},
		ca, namedLayer{runcLayer, "runc and its libraries from Debian's " + joinPackages(t, c.Keys)},
		namedLayer{bkLayer, "buildkitd and buildctl (go build of github.com/moby/buildkit, hack/buildkit)"},
		namedLayer{builderLayer, "/" + builderPath + " (go build ./cmd/builder) and its link /" + kmmRuncPath})
}
