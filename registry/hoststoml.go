package registry

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
)

// HostsFile is the part of a containerd hosts.toml (config_path layout:
// <config_path>/<registry host>/hosts.toml) that kmm honours.
type HostsFile struct {
	// File is where it was read from, for messages.
	File string
	// Server replaces the registry's default endpoint (https://<host>) when set.
	Server *HostEntry
	// Hosts are the [host."<url>"] tables, in the order of the file.
	Hosts []HostEntry
}

// HostEntry is a server or a [host."<url>"] table.
type HostEntry struct {
	// URL is the endpoint (scheme, host, optional path).
	URL string
	// Capabilities are "pull", "resolve", "push"; nil means all of them.
	Capabilities []string
	// CA are the files of CA certificates to trust, made absolute against the hosts.toml directory.
	CA []string
	// SkipVerify turns TLS certificate verification off for this host.
	SkipVerify bool
	// OverridePath says the URL's path is the API root (instead of <path>/v2).
	OverridePath bool
}

// hostsTOML is the on-disk shape: keys kmm ignores are ignored (header, client, dial_timeout).
type hostsTOML struct {
	Server       string              `toml:"server"`
	Capabilities []string            `toml:"capabilities"`
	CA           any                 `toml:"ca"`
	SkipVerify   *bool               `toml:"skip_verify"`
	OverridePath bool                `toml:"override_path"`
	Host         map[string]hostTOML `toml:"host"`
}

type hostTOML struct {
	Capabilities []string `toml:"capabilities"`
	CA           any      `toml:"ca"`
	SkipVerify   *bool    `toml:"skip_verify"`
	OverridePath bool     `toml:"override_path"`
}

// ParseHostsTOML parses a hosts.toml; file is its path (relative ca paths are resolved against its
// directory, as containerd does).
func ParseHostsTOML(file string, data []byte) (HostsFile, error) {
	var raw hostsTOML
	md, err := toml.Decode(string(data), &raw)
	if err != nil {
		return HostsFile{}, fmt.Errorf("%s: %w", file, err)
	}
	dir := filepath.Dir(file)
	hf := HostsFile{File: file}
	if raw.Server != "" {
		ca, err := caList(raw.CA, dir)
		if err != nil {
			return HostsFile{}, fmt.Errorf("%s: ca: %w", file, err)
		}
		s := HostEntry{URL: raw.Server, Capabilities: raw.Capabilities, CA: ca, SkipVerify: raw.SkipVerify != nil && *raw.SkipVerify, OverridePath: raw.OverridePath}
		if err := checkHostURL(s.URL); err != nil {
			return HostsFile{}, fmt.Errorf("%s: server: %w", file, err)
		}
		hf.Server = &s
	}
	for _, u := range hostOrder(md) {
		h := raw.Host[u]
		ca, err := caList(h.CA, dir)
		if err != nil {
			return HostsFile{}, fmt.Errorf("%s: host %q: ca: %w", file, u, err)
		}
		if err := checkHostURL(u); err != nil {
			return HostsFile{}, fmt.Errorf("%s: host %q: %w", file, u, err)
		}
		hf.Hosts = append(hf.Hosts, HostEntry{URL: u, Capabilities: h.Capabilities, CA: ca, SkipVerify: h.SkipVerify != nil && *h.SkipVerify, OverridePath: h.OverridePath})
	}
	if len(hf.Hosts) > MaxMirrors {
		return HostsFile{}, fmt.Errorf("%s: %d hosts, more than the %d kmm tries", file, len(hf.Hosts), MaxMirrors)
	}
	return hf, nil
}

// hostOrder returns the keys of the [host."..."] tables in the order of the file (containerd tries
// the hosts in that order; a map does not keep it).
func hostOrder(md toml.MetaData) []string {
	var out []string
	for _, k := range md.Keys() {
		if len(k) == 2 && k[0] == "host" && !slices.Contains(out, k[1]) {
			out = append(out, k[1])
		}
	}
	return out
}

// caList reads ca = "file" or ca = ["a", "b"], resolving relative paths against dir.
func caList(v any, dir string) ([]string, error) {
	var list []string
	switch c := v.(type) {
	case nil:
	case string:
		list = []string{c}
	case []any:
		for _, e := range c {
			s, ok := e.(string)
			if !ok {
				return nil, errors.New("want a path or a list of paths")
			}
			list = append(list, s)
		}
	default:
		return nil, errors.New("want a path or a list of paths")
	}
	for i, p := range list {
		if !filepath.IsAbs(p) {
			list[i] = filepath.Join(dir, p)
		}
	}
	return list, nil
}

// checkHostURL accepts http(s)://host[:port][/path].
func checkHostURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q: want http://host[:port][/path] or https://…", raw)
	}
	return nil
}

// can reports whether the entry has capability c (all capabilities when none are listed).
func (h HostEntry) can(c string) bool {
	return h.Capabilities == nil || slices.Contains(h.Capabilities, c)
}

// endpoint turns the entry into an Endpoint serving repository repo.
func (h HostEntry) endpoint(repo, source string, mirror bool) Endpoint {
	u, _ := url.Parse(h.URL) // checked when parsed
	root := strings.TrimSuffix(u.Path, "/")
	if !h.OverridePath && !strings.HasSuffix(root, "/v2") {
		root = path.Join("/", root, "v2")
	}
	return Endpoint{
		Host: u.Host, Repository: repo, PlainHTTP: u.Scheme == "http", SkipVerify: h.SkipVerify,
		CAFiles: h.CA, APIRoot: root, Mirror: mirror, Source: source,
	}
}
