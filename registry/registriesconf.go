package registry

import (
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// RegistriesConf is the part of a containers-registries.conf(5) file, version 2, that kmm honours:
// the [[registry]] tables.
type RegistriesConf struct {
	// File is where it was read from, for messages.
	File string
	// Registries are the [[registry]] tables in file order.
	Registries []Registry
}

// Registry is one [[registry]] table.
type Registry struct {
	// Prefix selects the images the table applies to: host[/path] or *.domain; "" means Location.
	Prefix string `toml:"prefix"`
	// Location replaces Prefix in the image name to reach the origin ("" with a wildcard prefix).
	Location string `toml:"location"`
	// Insecure allows plain HTTP and unverified TLS for the location.
	Insecure bool `toml:"insecure"`
	// Blocked forbids pulling matching images.
	Blocked bool `toml:"blocked"`
	// MirrorByDigestOnly uses the mirrors for digest references only.
	MirrorByDigestOnly bool `toml:"mirror-by-digest-only"`
	// Mirrors are tried in order before Location.
	Mirrors []Mirror `toml:"mirror"`
}

// Mirror is one [[registry.mirror]] table.
type Mirror struct {
	// Location replaces the registry's prefix to reach the mirror.
	Location string `toml:"location"`
	// Insecure allows plain HTTP and unverified TLS for the mirror.
	Insecure bool `toml:"insecure"`
	// PullFromMirror is "all" (""), "digest-only" or "tag-only".
	PullFromMirror string `toml:"pull-from-mirror"`
}

type registriesTOML struct {
	Registries []Registry `toml:"registry"`
}

// ParseRegistriesConf parses a registries.conf (version 2); other top-level keys
// (unqualified-search-registries, aliases, credential-helpers, …) are ignored.
func ParseRegistriesConf(file string, data []byte) (RegistriesConf, error) {
	var raw registriesTOML
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return RegistriesConf{}, fmt.Errorf("%s: %w", file, err)
	}
	for i := range raw.Registries {
		r := &raw.Registries[i]
		if r.Prefix == "" {
			r.Prefix = r.Location
		}
		if r.Prefix == "" {
			return RegistriesConf{}, fmt.Errorf("%s: [[registry]] %d has neither prefix nor location", file, i+1)
		}
		if strings.HasPrefix(r.Prefix, "*.") && r.Location != "" {
			return RegistriesConf{}, fmt.Errorf("%s: [[registry]] %q: a wildcard prefix takes no location", file, r.Prefix)
		}
		if len(r.Mirrors) > MaxMirrors {
			return RegistriesConf{}, fmt.Errorf("%s: [[registry]] %q has %d mirrors, more than the %d kmm tries", file, r.Prefix, len(r.Mirrors), MaxMirrors)
		}
		for _, m := range r.Mirrors {
			switch m.PullFromMirror {
			case "", "all", "digest-only", "tag-only":
			default:
				return RegistriesConf{}, fmt.Errorf("%s: [[registry]] %q: pull-from-mirror %q: want all, digest-only or tag-only", file, r.Prefix, m.PullFromMirror)
			}
			if m.Location == "" {
				return RegistriesConf{}, fmt.Errorf("%s: [[registry]] %q: a mirror without a location", file, r.Prefix)
			}
		}
	}
	return RegistriesConf{File: file, Registries: raw.Registries}, nil
}

// match returns the table whose prefix matches the image name (host/repo with the tag or digest)
// the longest, as containers/image picks it; ok is false when none matches.
func (c RegistriesConf) match(image string) (Registry, bool) {
	best, bestLen := Registry{}, -1
	for _, r := range c.Registries {
		if n := prefixMatch(r.Prefix, image); n > bestLen {
			best, bestLen = r, n
		}
	}
	return best, bestLen >= 0
}

// prefixMatch returns the length of the matched prefix, -1 when prefix does not match image. A
// prefix matches a whole name, or a leading part of it followed by "/", ":" or "@". "*.domain"
// matches any host below domain.
func prefixMatch(prefix, image string) int {
	if wild, ok := strings.CutPrefix(prefix, "*."); ok {
		host, _, _ := strings.Cut(image, "/")
		host, _, _ = strings.Cut(host, ":")
		if strings.HasSuffix(host, "."+wild) {
			return len(prefix)
		}
		return -1
	}
	if !strings.HasPrefix(image, prefix) {
		return -1
	}
	if len(image) == len(prefix) || strings.ContainsRune("/:@", rune(image[len(prefix)])) {
		return len(prefix)
	}
	return -1
}
