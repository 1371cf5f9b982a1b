package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// maxDockerfileBytes bounds the Dockerfile read to find its registries (a ConfigMap holds at most
// 1 MiB).
const maxDockerfileBytes = 1 << 20

// tlsSetting is how buildkitd reaches one registry.
type tlsSetting struct{ http, skipVerify bool }

// registryHosts returns the TLS setting of each registry the build talks to: the FROM images'
// (base) and the pushed image's. A registry both pulled from and pushed to gets both settings.
func registryHosts(dockerfile string, args []string, image string, base, push tlsSetting) (map[string]tlsSetting, error) {
	hosts := map[string]tlsSetting{}
	add := func(host string, s tlsSetting) {
		if !s.http && !s.skipVerify {
			return
		}
		h := hosts[host]
		hosts[host] = tlsSetting{http: h.http || s.http, skipVerify: h.skipVerify || s.skipVerify}
	}
	for _, ref := range fromImages(dockerfile, args) {
		r, err := name.ParseReference(ref, name.WeakValidation)
		if err != nil {
			continue // a stage name or an unresolved variable: BuildKit reports it
		}
		add(r.Context().RegistryStr(), base)
	}
	r, err := name.ParseReference(image, name.WeakValidation)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", image, err)
	}
	add(r.Context().RegistryStr(), push)
	return hosts, nil
}

// fromImages returns the images of the Dockerfile's FROM lines with the build arguments (and the
// defaults of ARGs before the first FROM) substituted, without scratch and earlier stages.
func fromImages(dockerfile string, args []string) []string {
	vars := map[string]string{}
	userArgs := map[string]string{}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		userArgs[k] = v
	}
	stages := map[string]bool{"scratch": true}
	var images []string
	sc := bufio.NewScanner(strings.NewReader(dockerfile))
	sc.Buffer(make([]byte, 64<<10), maxDockerfileBytes)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "ARG":
			k, v, _ := strings.Cut(f[1], "=")
			if u, ok := userArgs[k]; ok {
				v = u
			}
			vars[k] = v
		case "FROM":
			ref, stage := fromLine(f[1:], vars)
			if ref != "" && !stages[strings.ToLower(ref)] {
				images = append(images, ref)
			}
			if stage != "" {
				stages[strings.ToLower(stage)] = true
			}
		}
	}
	return images
}

// fromLine reads "FROM [--platform=...] image [AS stage]".
func fromLine(f []string, vars map[string]string) (ref, stage string) {
	for len(f) > 0 && strings.HasPrefix(f[0], "--") {
		f = f[1:]
	}
	if len(f) == 0 {
		return "", ""
	}
	ref = os.Expand(f[0], func(k string) string { return vars[k] })
	if len(f) >= 3 && strings.EqualFold(f[1], "AS") {
		stage = f[2]
	}
	return ref, stage
}

// runcWrapper is the builder binary under another name (a link in the image): it runs runc with
// --rootless=true, so that runc ignores the cgroups it cannot create in an unprivileged pod.
const runcWrapper = "kmm-runc"

// daemonConfig is buildkitd's configuration: the OCI worker on runc with the snapshotter BuildKit
// picks (overlayfs where the state directory allows it, native copies on an overlay), no containerd
// worker, and the registries' TLS settings.
// Unprivileged, the worker runs RUN steps as BuildKit's rootless mode does, though buildkitd is
// root: no cgroups of their own (the pod's bound them) and no /sys, through runcWrapper.
func daemonConfig(hosts map[string]tlsSetting, unprivileged bool, wrapper string) string {
	var b strings.Builder
	b.WriteString("[worker.oci]\n  enabled = true\n  snapshotter = \"auto\"\n")
	if unprivileged {
		fmt.Fprintf(&b, "  rootless = true\n  binary = %q\n", wrapper)
	}
	b.WriteString("[worker.containerd]\n  enabled = false\n")
	names := make([]string, 0, len(hosts))
	for h := range hosts {
		names = append(names, h)
	}
	sort.Strings(names)
	for _, h := range names {
		s := hosts[h]
		fmt.Fprintf(&b, "[registry.%q]\n  http = %t\n  insecure = %t\n", h, s.http, s.skipVerify)
	}
	return b.String()
}

// readDockerfile reads the mounted Dockerfile, bounded.
func readDockerfile(dir string) (string, error) {
	f, err := os.Open(filepath.Join(dir, "Dockerfile"))
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, maxDockerfileBytes+1)
	n, err := readFull(f, buf)
	if err != nil {
		return "", err
	}
	if n > maxDockerfileBytes {
		return "", fmt.Errorf("the Dockerfile exceeds %d bytes", maxDockerfileBytes)
	}
	return string(buf[:n]), nil
}
