package main

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kmm-project/kmm/registry"
)

// maxDockerfileBytes bounds the Dockerfile read to find its registries (a ConfigMap holds at most
// 1 MiB).
const maxDockerfileBytes = 1 << 20

// hostConfig is buildkitd's [registry."host"] table: the mirrors of an origin, and how buildkitd
// reaches the host (plain HTTP, unverified TLS, CA files).
type hostConfig struct {
	mirrors          []string
	http, skipVerify bool
	ca               []string
}

// daemonRegistries turns the registry settings (the worker's flags, registry.Flags) into buildkitd's
// registry tables for every registry the build talks to: the FROM images' (with the Module's
// baseImageRegistryTLS) and the pushed image's (with its registryTLS). The endpoints are
// registry.Plan's, as the worker's: mirrors become the origin's mirrors, each endpoint host gets its
// TLS settings and CA files. It also returns the endpoints (for their credentials) and what
// buildkitd cannot express (a mirror that rewrites a repository path other than a prefix, an API
// root other than /v2), which is left out and reported in the build log.
func daemonRegistries(dockerfile string, args []string, image string, base, push registry.ModuleTLS, f registry.Flags) (map[string]*hostConfig, []registry.Endpoint, []string, error) {
	hosts := map[string]*hostConfig{}
	var eps []registry.Endpoint
	var notes []string
	plan := func(ref name.Reference, tls registry.ModuleTLS) error {
		planned, err := registry.PlanFor(f.Sources, ref, tls)
		if err != nil {
			return err
		}
		origin := buildkitHost(ref.Context().RegistryStr())
		for _, ep := range planned {
			note, err := addEndpoint(hosts, origin, ref.Context().RepositoryStr(), ep, f.Trust)
			if err != nil {
				return err
			}
			if note != "" {
				notes = append(notes, note)
				continue
			}
			eps = append(eps, ep)
		}
		return nil
	}
	for _, from := range fromImages(dockerfile, args) {
		r, err := name.ParseReference(from, name.WeakValidation)
		if err != nil {
			continue // a stage name or an unresolved variable: BuildKit reports it
		}
		if err := plan(r, base); err != nil {
			return nil, nil, nil, fmt.Errorf("FROM %s: %w", from, err)
		}
	}
	r, err := name.ParseReference(image, name.WeakValidation)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("image %q: %w", image, err)
	}
	if err := plan(r, push); err != nil {
		return nil, nil, nil, fmt.Errorf("pushing %s: %w", image, err)
	}
	return hosts, eps, notes, nil
}

// addEndpoint records one endpoint of origin's plan: a mirror (or a hosts.toml server on another
// host) in origin's mirrors, and the endpoint host's TLS settings and CA files.
func addEndpoint(hosts map[string]*hostConfig, origin, repo string, ep registry.Endpoint, trust registry.Trust) (string, error) {
	host := buildkitHost(ep.Host)
	if host != origin {
		prefix, ok := strings.CutSuffix(ep.Repository, repo)
		if !ok || ep.APIRoot != "/v2" || (prefix != "" && !strings.HasSuffix(prefix, "/")) {
			return fmt.Sprintf("registry settings: %s left out, buildkitd cannot serve %s as %s/%s under %s", ep, repo, ep.Host, ep.Repository, ep.APIRoot), nil
		}
		o := config(hosts, origin)
		if m := path.Join(ep.Host, prefix); !slices.Contains(o.mirrors, m) {
			o.mirrors = append(o.mirrors, m)
		}
	}
	files, err := ep.TrustedCAFiles(trust)
	if err != nil {
		return "", err
	}
	c := config(hosts, host)
	c.http, c.skipVerify = c.http || ep.PlainHTTP, c.skipVerify || ep.SkipVerify
	for _, f := range files {
		if _, err := os.Stat(f); err == nil && !slices.Contains(c.ca, f) {
			c.ca = append(c.ca, f) // buildkitd refuses to start on a missing CA file; the worker skips it
		}
	}
	return "", nil
}

func config(hosts map[string]*hostConfig, host string) *hostConfig {
	if hosts[host] == nil {
		hosts[host] = &hostConfig{}
	}
	return hosts[host]
}

// buildkitHost is the name buildkitd's configuration gives a registry: docker.io for Docker Hub.
func buildkitHost(reg string) string {
	if reg == name.DefaultRegistry {
		return "docker.io"
	}
	return reg
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
// worker, and the registries' mirrors and TLS settings.
// Unprivileged, the worker runs RUN steps as BuildKit's rootless mode does, though buildkitd is
// root: no cgroups of their own (the pod's bound them) and no /sys, through runcWrapper.
func daemonConfig(hosts map[string]*hostConfig, unprivileged bool, wrapper string) string {
	var b strings.Builder
	b.WriteString("[worker.oci]\n  enabled = true\n  snapshotter = \"auto\"\n")
	if unprivileged {
		fmt.Fprintf(&b, "  rootless = true\n  binary = %q\n", wrapper)
	}
	b.WriteString("[worker.containerd]\n  enabled = false\n")
	names := make([]string, 0, len(hosts))
	for h, c := range hosts {
		if len(c.mirrors) > 0 || c.http || c.skipVerify || len(c.ca) > 0 {
			names = append(names, h)
		}
	}
	sort.Strings(names)
	for _, h := range names {
		c := hosts[h]
		fmt.Fprintf(&b, "[registry.%q]\n", h)
		if len(c.mirrors) > 0 {
			fmt.Fprintf(&b, "  mirrors = %s\n", tomlList(c.mirrors))
		}
		fmt.Fprintf(&b, "  http = %t\n  insecure = %t\n", c.http, c.skipVerify)
		if len(c.ca) > 0 {
			fmt.Fprintf(&b, "  ca = %s\n", tomlList(c.ca))
		}
	}
	return b.String()
}

func tomlList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
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
