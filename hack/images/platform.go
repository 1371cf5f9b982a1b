package main

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// platform is one entry of the image indexes: the names Go, Debian and OCI give it, and what its
// ELF files look like.
type platform struct {
	GOARCH  string      // Go's name, also Debian's architecture name for the two we build
	Variant string      // OCI platform variant ("v8" for arm64)
	Triplet string      // Debian's multiarch directory under /usr/lib
	Machine elf.Machine // e_machine of the platform's ELF files
}

// knownPlatforms are the platforms build supports.
var knownPlatforms = map[string]platform{
	"linux/amd64": {GOARCH: "amd64", Triplet: "x86_64-linux-gnu", Machine: elf.EM_X86_64},
	"linux/arm64": {GOARCH: "arm64", Variant: "v8", Triplet: "aarch64-linux-gnu", Machine: elf.EM_AARCH64},
}

func (p platform) String() string { return "linux/" + p.GOARCH }

// oci returns the platform as an index entry names it.
func (p platform) oci() *v1.Platform {
	return &v1.Platform{OS: "linux", Architecture: p.GOARCH, Variant: p.Variant}
}

// parsePlatforms reads a comma-separated list of platforms, keeping its order.
func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	seen := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		p, ok := knownPlatforms[name]
		if !ok {
			return nil, fmt.Errorf("platform %q: want linux/amd64 or linux/arm64", name)
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// binaries are the paths of the two Go programs built for one platform.
type binaries struct {
	Manager string
	Worker  string
}

// goBuildFlags make the binaries static and reproducible: no cgo, no file system paths, no build
// ID and no VCS stamp (so a dirty tree and a clean clone of one commit give the same bytes).
var goBuildFlags = []string{"-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid="}

// goBuild cross-compiles ./cmd/manager and ./cmd/worker of the module at repo for p into
// <cache>/go/<arch>/.
func goBuild(ctx context.Context, repo string, p platform, cache string) (binaries, error) {
	dir, err := filepath.Abs(filepath.Join(cache, "go", p.GOARCH))
	if err != nil {
		return binaries{}, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return binaries{}, err
	}
	args := append([]string{"build"}, goBuildFlags...)
	args = append(args, "-o", dir+"/", "./cmd/manager", "./cmd/worker")
	cmd := exec.CommandContext(ctx, "go", args...) // #nosec G204 -- go build with our flags and packages
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+p.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		return binaries{}, fmt.Errorf("go build for %s: %w\n%s", p, err, out)
	}
	return binaries{Manager: filepath.Join(dir, "manager"), Worker: filepath.Join(dir, "worker")}, nil
}

// lockDir creates dir and holds an exclusive lock on dir/lock until the returned function runs, so
// that two builds (make images and the tests) do not update the apt state at the same time.
func lockDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600) // #nosec G304 -- our own cache directory
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil { // #nosec G115 -- a file descriptor fits an int
		_ = f.Close()
		return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
	}
	return func() { _ = f.Close() }, nil
}
