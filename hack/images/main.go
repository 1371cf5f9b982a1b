// Command images builds kmm's two container images, the operator (kmm-manager) and the worker
// (kmm-worker), as OCI image layouts without a container engine, and pushes them to a registry.
//
//	images build [--out bin/images] [--cache bin/images/cache] [--platforms linux/amd64,linux/arm64]
//	       [--epoch <unix seconds>] [--tag dev] [--suite bookworm] [--mirror <url>] [--security-mirror <url>]
//	       [--apt-max-age 24h]
//	images builder [the flags of build]
//	images push --layout <dir> --ref <registry/repository:tag>
//
// build cross-compiles the static manager and worker binaries for every platform (CGO off,
// -trimpath, no build ID), fetches Debian's kmod and ca-certificates packages and the packages of
// the shared libraries kmod needs with apt-get download (from a private apt state under --cache,
// so the host's apt configuration, architectures and lists are left as they are), reads them with
// dpkg-deb, resolves the DT_NEEDED closure of modprobe and depmod with debug/elf, and assembles
// with go-containerregistry:
//
//	kmm-manager  /manager (user 65532:65532, entrypoint /manager), /etc/ssl/certs/ca-certificates.crt
//	kmm-worker   /usr/local/bin/worker (entrypoint), /usr/sbin/modprobe and /usr/sbin/depmod (links to
//	             /bin/kmod), kmod's shared libraries and the dynamic loader, the CA bundle
//
// Each is an image index for the platforms, written to <out>/kmm-manager and <out>/kmm-worker. The
// build is reproducible: every timestamp is --epoch, tar entries are sorted with fixed owners and
// modes, and the binaries carry no build ID, so two builds of one commit with the same Debian
// packages have the same digests. Downloaded packages stay under --cache.
//
// builder builds the third image, kmm-builder, the same way: kmm's cmd/builder and BuildKit's
// buildkitd and buildctl (from the hack/buildkit module) static, Debian's runc with its library
// closure, the CA bundle; written to <out>/kmm-builder.
//
// push copies the image index of a layout to a registry; registries on localhost and 127.0.0.1 are
// reached over plain HTTP. docs/images.md describes the images and the build.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// run dispatches to the subcommand named by args[0].
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: images build|builder|push [flags]")
	}
	switch args[0] {
	case "build":
		return runBuild(ctx, args[1:], stdout, stderr)
	case "builder":
		return runBuilder(ctx, args[1:], stdout, stderr)
	case "push":
		return runPush(ctx, args[1:], stdout, stderr)
	default:
		return fmt.Errorf("unknown subcommand %q: want build, builder or push", args[0])
	}
}

func runBuild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseImageFlags("build", args, stderr, imageFlagHelp{
		out: "Directory of the OCI layouts (kmm-manager, kmm-worker).", platforms: "Platforms of the image indexes.",
		epoch: "Time of every file and of the image configs, in Unix seconds (default $SOURCE_DATE_EPOCH, else 0).",
		tag:   "Tag recorded in each layout's index.json (org.opencontainers.image.ref.name).",
		suite: "Debian release the kmod and ca-certificates packages come from.",
	})
	if err != nil {
		return err
	}
	platforms, deb, when := f.platforms, f.deb, f.epoch

	start := time.Now()
	bins := map[string]binaries{}
	for _, p := range platforms {
		_, _ = fmt.Fprintf(stderr, ">> go build %s\n", p)
		b, err := goBuild(ctx, ".", p, f.cache)
		if err != nil {
			return err
		}
		bins[p.String()] = b
	}
	// One build at a time uses the apt state and writes the layouts.
	unlock, err := lockDir(f.cache)
	if err != nil {
		return err
	}
	defer unlock()
	set, err := assemble(ctx, assembleOptions{Platforms: platforms, Binaries: bins, Debian: deb, Epoch: when})
	if err != nil {
		return err
	}
	digests, err := set.writeLayouts(f.out, f.tag)
	if err != nil {
		return err
	}
	for _, d := range digests {
		if _, err := fmt.Fprintf(stdout, "%s\t%s\t%s\n", d.Name, d.Digest, d.Layout); err != nil {
			return err
		}
	}
	_, _ = fmt.Fprintf(stderr, ">> images built in %s\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

func runPush(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	fs.SetOutput(stderr)
	layoutDir := fs.String("layout", "", "OCI layout written by build (e.g. bin/images/kmm-manager).")
	ref := fs.String("ref", "", "Destination, registry/repository:tag.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *layoutDir == "" || *ref == "" || fs.NArg() != 0 {
		return errors.New("usage: images push --layout <dir> --ref <registry/repository:tag>")
	}
	d, err := push(ctx, *layoutDir, *ref)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s@%s\n", *ref, d)
	return err
}

// parseEpoch reads Unix seconds; "" is 0 (1970-01-01T00:00:00Z).
func parseEpoch(s string) (time.Time, error) {
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("epoch %q: want non-negative Unix seconds", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// runBuilder builds the builder image (kmm-builder) into <out>/kmm-builder.
func runBuilder(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseImageFlags("builder", args, stderr, imageFlagHelp{
		out: "Directory of the OCI layout (kmm-builder).", platforms: "Platforms of the image index.",
		epoch: "Time of every file and of the image config, in Unix seconds (default $SOURCE_DATE_EPOCH, else 0).",
		tag:   "Tag recorded in the layout's index.json.", suite: "Debian release runc comes from.",
	})
	if err != nil {
		return err
	}
	platforms, deb, when := f.platforms, f.deb, f.epoch
	start := time.Now()
	bins := map[string]builderBinaries{}
	for _, p := range platforms {
		_, _ = fmt.Fprintf(stderr, ">> go build builder, buildkitd, buildctl %s\n", p)
		b, err := goBuildBuilder(ctx, ".", p, f.cache)
		if err != nil {
			return err
		}
		bins[p.String()] = b
	}
	unlock, err := lockDir(f.cache)
	if err != nil {
		return err
	}
	defer unlock()
	idx, err := assembleBuilder(ctx, platforms, bins, deb, when)
	if err != nil {
		return err
	}
	dir := filepath.Join(f.out, builderName)
	if err := writeLayout(dir, idx, f.tag); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\t%s\t%s\n", builderName, d, dir)
	_, _ = fmt.Fprintf(stderr, ">> builder image built in %s\n", time.Since(start).Round(100*time.Millisecond))
	return err
}

// imageFlags are what the build and builder subcommands share: where the layouts go, the apt and
// Go cache, the platforms, the files' time, the tag, and the Debian archive.
type imageFlags struct {
	out, cache, tag string
	platforms       []platform
	epoch           time.Time
	deb             *debian
}

// imageFlagHelp is the help of the flags whose meaning differs between the subcommands.
type imageFlagHelp struct{ out, platforms, epoch, tag, suite string }

// parseImageFlags parses the flags of subcommand name.
func parseImageFlags(name string, args []string, stderr io.Writer, help imageFlagHelp) (*imageFlags, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "bin/images", help.out)
	cache := fs.String("cache", "bin/images/cache", "Directory of the private apt state, the downloaded .deb files and the Go binaries.")
	plats := fs.String("platforms", "linux/amd64,linux/arm64", help.platforms)
	epoch := fs.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), help.epoch)
	tag := fs.String("tag", "dev", help.tag)
	suite := fs.String("suite", "bookworm", help.suite)
	mirror := fs.String("mirror", "http://deb.debian.org/debian", "Debian archive.")
	security := fs.String("security-mirror", "http://deb.debian.org/debian-security", "Debian security archive (\"\" for none).")
	maxAge := fs.Duration("apt-max-age", 24*time.Hour, "Age after which the private apt lists are refreshed (apt-get update).")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("%s takes no arguments, got %q", name, fs.Args())
	}
	when, err := parseEpoch(*epoch)
	if err != nil {
		return nil, err
	}
	platforms, err := parsePlatforms(*plats)
	if err != nil {
		return nil, err
	}
	deb := &debian{Dir: *cache, Mirror: *mirror, SecurityMirror: *security, Suite: *suite, MaxAge: *maxAge, Log: stderr}
	return &imageFlags{out: *out, cache: *cache, tag: *tag, platforms: platforms, epoch: when, deb: deb}, nil
}
