package registry

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// MaxMirrors bounds the mirrors of one registry that kmm tries (a hosts.toml or a [[registry]]
// with more is refused).
const MaxMirrors = 16

// Settings are the registry configuration sources that apply to one image, parsed. Plan consults
// them in this order and uses the first that has an entry for the image's registry.
type Settings struct {
	// Operator are registries.conf files the operator hands to every worker (a ConfigMap).
	Operator []RegistriesConf
	// Containerd is the hosts.toml of the image's registry (<config_path>/<host>/hosts.toml), or
	// else <config_path>/_default/hosts.toml; nil when there is none.
	Containerd *HostsFile
	// Node are the node's registries.conf files (CRI-O, podman).
	Node []RegistriesConf
}

// ModuleTLS are the Module's own registryTLS settings; they apply to the origin only.
type ModuleTLS struct {
	// Insecure allows plain HTTP.
	Insecure bool
	// SkipVerify turns certificate verification off.
	SkipVerify bool
}

// Endpoint is one place to pull an image from.
type Endpoint struct {
	// Host is host[:port].
	Host string
	// Repository is the repository path at Host.
	Repository string
	// PlainHTTP allows plain HTTP (go-containerregistry still tries HTTPS first).
	PlainHTTP bool
	// SkipVerify turns TLS certificate verification off.
	SkipVerify bool
	// CAFiles are extra CA certificate files to trust for this host.
	CAFiles []string
	// APIRoot is the path of the registry API, "/v2" unless the configuration says otherwise.
	APIRoot string
	// Mirror is false for the origin (or the hosts.toml server that replaces it).
	Mirror bool
	// Server marks a hosts.toml server (which may be a mirror in all but name).
	Server bool
	// Source names the file that configured the endpoint, "" for the plain origin.
	Source string
}

// String names the endpoint in messages: host, role and where it came from.
func (e Endpoint) String() string {
	role := "origin"
	switch {
	case e.Mirror:
		role = "mirror"
	case e.Server:
		role = "server"
	}
	if e.Source != "" {
		role += " from " + e.Source
	}
	return e.Host + " (" + role + ")"
}

// BlockedError is returned by Plan when the configuration forbids pulling the image.
type BlockedError struct {
	// Image is the reference and File the registries.conf that blocks it.
	Image, File string
}

func (e *BlockedError) Error() string {
	return fmt.Sprintf("%s is blocked by %s (blocked = true)", e.Image, e.File)
}

// Plan returns the endpoints to try for ref, in order: the configured mirrors, then the origin
// (or, with containerd, the hosts.toml server that replaces it). It does no I/O.
func Plan(ref name.Reference, s Settings, module ModuleTLS) ([]Endpoint, error) {
	host, repo := canonicalHost(ref.Context().RegistryStr()), ref.Context().RepositoryStr()
	_, isDigest := ref.(name.Digest)
	image := host + "/" + repo + refSuffix(ref)
	var eps []Endpoint
	var err error
	if r, conf, ok := matchConf(s.Operator, image); ok {
		eps, err = planRegistriesConf(r, conf.File, image, host, repo, isDigest)
	} else if s.Containerd != nil {
		eps = planContainerd(*s.Containerd, ref.Context().RegistryStr(), repo, isDigest)
	} else if r, conf, ok := matchConf(s.Node, image); ok {
		eps, err = planRegistriesConf(r, conf.File, image, host, repo, isDigest)
	} else {
		eps = []Endpoint{{Host: ref.Context().RegistryStr(), Repository: repo, APIRoot: "/v2"}}
	}
	if err != nil {
		return nil, err
	}
	for i := range eps {
		if !eps[i].Mirror {
			eps[i].PlainHTTP = eps[i].PlainHTTP || module.Insecure
			eps[i].SkipVerify = eps[i].SkipVerify || module.SkipVerify
		}
	}
	return eps, nil
}

// canonicalHost is the name configuration files use for a registry: docker.io for Docker Hub.
func canonicalHost(reg string) string {
	if reg == name.DefaultRegistry {
		return "docker.io"
	}
	return reg
}

func refSuffix(ref name.Reference) string {
	if d, ok := ref.(name.Digest); ok {
		return "@" + d.DigestStr()
	}
	return ":" + ref.Identifier()
}

func matchConf(confs []RegistriesConf, image string) (Registry, RegistriesConf, bool) {
	for _, c := range confs {
		if r, ok := c.match(image); ok {
			return r, c, true
		}
	}
	return Registry{}, RegistriesConf{}, false
}

// planContainerd follows containerd's hosts.toml: the [host] tables that can serve the reference
// (resolve for a tag, pull for a digest), then the server or, without one, https://<registry>.
func planContainerd(hf HostsFile, reg, repo string, isDigest bool) []Endpoint {
	need := "resolve"
	if isDigest {
		need = "pull"
	}
	var eps []Endpoint
	for _, h := range hf.Hosts {
		if h.can(need) {
			eps = append(eps, h.endpoint(repo, hf.File, true))
		}
	}
	if hf.Server != nil {
		if hf.Server.can(need) {
			ep := hf.Server.endpoint(repo, hf.File, false)
			ep.Server = true
			// A [host] table for the server itself (a common way to set its capabilities) is the
			// server: it is tried once, last.
			eps = slices.DeleteFunc(eps, func(m Endpoint) bool { return m.Host == ep.Host && m.APIRoot == ep.APIRoot })
			eps = append(eps, ep)
		}
		return eps
	}
	return append(eps, Endpoint{Host: reg, Repository: repo, APIRoot: "/v2", Source: hf.File})
}

// planRegistriesConf follows a [[registry]] table: blocked, else its mirrors (subject to
// pull-from-mirror and mirror-by-digest-only), then its location.
func planRegistriesConf(r Registry, file, image, host, repo string, isDigest bool) ([]Endpoint, error) {
	if r.Blocked {
		return nil, &BlockedError{Image: image, File: file}
	}
	rest := strings.TrimPrefix(host+"/"+repo, r.Prefix)
	var eps []Endpoint
	for _, m := range r.Mirrors {
		mode := m.PullFromMirror
		if r.MirrorByDigestOnly && mode == "" {
			mode = "digest-only"
		}
		if (mode == "digest-only" && !isDigest) || (mode == "tag-only" && isDigest) {
			continue
		}
		ep, err := rewritten(m.Location+rest, m.Insecure, file, true)
		if err != nil {
			return nil, err
		}
		eps = append(eps, ep)
	}
	origin := Endpoint{Host: host, Repository: repo, APIRoot: "/v2", PlainHTTP: r.Insecure, SkipVerify: r.Insecure, Source: file}
	if r.Location != "" && !strings.HasPrefix(r.Prefix, "*.") {
		ep, err := rewritten(r.Location+rest, r.Insecure, file, false)
		if err != nil {
			return nil, err
		}
		origin = ep
	}
	return append(eps, origin), nil
}

// rewritten is the endpoint of the repository name loc (host/path).
func rewritten(loc string, insecure bool, file string, mirror bool) (Endpoint, error) {
	r, err := name.NewRepository(loc)
	if err != nil {
		return Endpoint{}, fmt.Errorf("%s: %q is not a repository name: %w", file, loc, err)
	}
	return Endpoint{Host: r.RegistryStr(), Repository: r.RepositoryStr(), APIRoot: "/v2", PlainHTTP: insecure, SkipVerify: insecure, Mirror: mirror, Source: file}, nil
}
