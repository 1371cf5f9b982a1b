//go:build e2e

package e2e_test

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/build"
)

// brokenDockerfile fails in its RUN step after printing a line (brokenOutput: upper case, so
// that it is not found in BuildKit's quote of the command).
const brokenDockerfile = `ARG BASE
FROM ${BASE}
RUN echo "kmm-e2e: the step's own output" | tr a-z A-Z && make -C /nonexistent
`

const brokenOutput = "KMM-E2E: THE STEP'S OWN OUTPUT"

// builderImage builds kmm-builder for this machine's platform into the run's folder.
func builderImage(logFile string) error {
	log, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command("go", "run", "./hack/images", "builder", "--platforms", "linux/"+runtime.GOARCH,
		"--out", filepath.Join(shared.dir, "images"), "--cache", filepath.Join(shared.root, "bin", "images", "cache"))
	cmd.Dir, cmd.Stdout, cmd.Stderr = shared.root, log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("images builder: %w (see %s)", err, logFile)
	}
	return nil
}

// buildResult parses the build container's termination message.
func buildResult(t *testing.T, p *corev1.Pod) build.Result {
	t.Helper()
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == build.ContainerName && s.State.Terminated != nil {
			r, err := build.ParseResult([]byte(s.State.Terminated.Message))
			if err != nil {
				t.Fatalf("build pod %s (%s): %v: %q", p.Name, p.Status.Phase, err, s.State.Terminated.Message)
			}
			return r
		}
	}
	t.Fatalf("build pod %s (%s) has no terminated builder container: %v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
	return build.Result{}
}

// imageFiles reads the regular files of the image's flattened file system.
func imageFiles(img v1.Image) (map[string][]byte, error) {
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(io.LimitReader(tr, 64<<20))
			if err != nil {
				return nil, err
			}
			files[strings.TrimPrefix(hdr.Name, "/")] = data
		}
	}
}

// modinfo reads a kernel module's .modinfo section (key=value strings, NUL-separated).
func modinfo(t *testing.T, ko []byte) map[string]string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		t.Fatalf("module is not ELF: %v", err)
	}
	s := f.Section(".modinfo")
	if s == nil {
		t.Fatal("module has no .modinfo section")
	}
	data, err := s.Data()
	if err != nil {
		t.Fatal(err)
	}
	info := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			info[k] = v
		}
	}
	return info
}

func keys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// kmodDockerfile is the user's Dockerfile: the module's source inline (a heredoc: the ConfigMap
// holds the Dockerfile only), built with kbuild in the base image against the Debian headers of
// HEADERS_RELEASE (this host's kernel, the node's, has no headers to build against: the module is
// installed for KERNEL_FULL_VERSION, the node's, where the worker looks, and loaded there in
// dry-run), its version made of kmm's MOD_NAMESPACE and MOD_NAME and the build secret (mounted
// at upstream's path: BuildKit's default target for the id <name>/<key> is /run/secrets/<key>;
// required, so that a secret the builder did not pass fails the step), depmod run, and copied into a scratch image the way kmm's worker reads kmod images.
func kmodDockerfile(source string) string {
	return `ARG BASE
FROM ${BASE} AS builder
ARG KERNEL_FULL_VERSION
ARG HEADERS_RELEASE
ARG MOD_NAME
ARG MOD_NAMESPACE
COPY <<'KMOD_SOURCE' /src/kmm_e2e_build.c
` + source + `KMOD_SOURCE
RUN --mount=type=secret,id=` + buildSecretName + `/` + buildSecretKey + `,target=/run/secrets/` + buildSecretName + `/` + buildSecretKey + `,required=true \
    printf '%s\n' 'obj-m := kmm_e2e_build.o' "ccflags-y := -DKMM_NAME='\"kmm_e2e_build\"' -DKMM_VERSION='\"${MOD_NAMESPACE}.${MOD_NAME}.$(cat /run/secrets/` + buildSecretName + `/` + buildSecretKey + `)\"'" > /src/Kbuild && \
    make -C /usr/src/linux-headers-${HEADERS_RELEASE} M=/src modules && \
    mkdir -p /opt/lib/modules/${KERNEL_FULL_VERSION}/extra && \
    cp /src/kmm_e2e_build.ko /opt/lib/modules/${KERNEL_FULL_VERSION}/extra/ && \
    depmod -b /opt ${KERNEL_FULL_VERSION}

FROM scratch
ARG KERNEL_FULL_VERSION
COPY --from=builder /opt/lib/modules/${KERNEL_FULL_VERSION} /opt/lib/modules/${KERNEL_FULL_VERSION}
`
}
