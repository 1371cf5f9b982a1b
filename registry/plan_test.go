package registry

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
)

func mustHosts(t *testing.T, file, body string) *HostsFile {
	t.Helper()
	hf, err := ParseHostsTOML(file, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return &hf
}

func mustConf(t *testing.T, file, body string) RegistriesConf {
	t.Helper()
	c, err := ParseRegistriesConf(file, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const digest = "sha256:0123456789012345678901234567890123456789012345678901234567890123"

func TestPlan(t *testing.T) {
	const hostsFile = "/etc/containerd/certs.d/quay.io/hosts.toml"
	mirrors := mustHosts(t, hostsFile, `
server = "https://quay.io"

[host."https://m2.example:5000"]
  capabilities = ["pull", "resolve"]
  ca = "m2-ca.crt"

[host."http://m1.example"]
  capabilities = ["pull", "resolve"]

[host."https://digest-only.example/v2/quay"]
  capabilities = ["pull"]
  override_path = true
  skip_verify = true
`)
	mirrorsOnly := mustHosts(t, hostsFile, `
server = "https://m1.example/prefix"
ca = ["/etc/pki/m1.pem", "m1-extra.pem"]
`)
	defaultServer := mustHosts(t, hostsFile, `
[host."https://m1.example"]
`)
	conf := mustConf(t, "/etc/containers/registries.conf", `
unqualified-search-registries = ["docker.io"]

[[registry]]
prefix = "quay.io/org"
location = "quay.io/org"
mirror-by-digest-only = true
[[registry.mirror]]
location = "mirror.example/quay-org"
[[registry.mirror]]
location = "plain.example:5000/q"
insecure = true
pull-from-mirror = "all"

[[registry]]
location = "quay.io"
[[registry.mirror]]
location = "mirror.example/quay"
pull-from-mirror = "tag-only"

[[registry]]
prefix = "*.evil.example"
blocked = true

[[registry]]
location = "docker.io"
[[registry.mirror]]
location = "hub-mirror.example"
`)
	operator := mustConf(t, "/etc/kmm/registries/registries.conf", `
[[registry]]
location = "quay.io/org/blocked"
blocked = true
`)
	origin := func(host, repo string) Endpoint { return Endpoint{Host: host, Repository: repo, APIRoot: "/v2"} }

	cases := map[string]struct {
		image   string
		s       Settings
		module  ModuleTLS
		want    []Endpoint
		blocked bool
	}{
		"no configuration: the origin": {
			image: "quay.io/org/kmod:v1", want: []Endpoint{origin("quay.io", "org/kmod")},
		},
		"no configuration: the Module's TLS settings apply to the origin": {
			image: "quay.io/org/kmod:v1", module: ModuleTLS{Insecure: true, SkipVerify: true},
			want: []Endpoint{{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", PlainHTTP: true, SkipVerify: true}},
		},
		"hosts.toml: resolving mirrors in file order, then the server": {
			image: "quay.io/org/kmod:v1", s: Settings{Containerd: mirrors}, module: ModuleTLS{SkipVerify: true},
			want: []Endpoint{
				{Host: "m2.example:5000", Repository: "org/kmod", APIRoot: "/v2", CAFiles: []string{"/etc/containerd/certs.d/quay.io/m2-ca.crt"}, Mirror: true, Source: hostsFile},
				{Host: "m1.example", Repository: "org/kmod", APIRoot: "/v2", PlainHTTP: true, Mirror: true, Source: hostsFile},
				{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", SkipVerify: true, Server: true, Source: hostsFile},
			},
		},
		"hosts.toml: a pull-only mirror serves digests, with its own API root": {
			image: "quay.io/org/kmod@" + digest, s: Settings{Containerd: mirrors},
			want: []Endpoint{
				{Host: "m2.example:5000", Repository: "org/kmod", APIRoot: "/v2", CAFiles: []string{"/etc/containerd/certs.d/quay.io/m2-ca.crt"}, Mirror: true, Source: hostsFile},
				{Host: "m1.example", Repository: "org/kmod", APIRoot: "/v2", PlainHTTP: true, Mirror: true, Source: hostsFile},
				{Host: "digest-only.example", Repository: "org/kmod", APIRoot: "/v2/quay", SkipVerify: true, Mirror: true, Source: hostsFile},
				{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", Server: true, Source: hostsFile},
			},
		},
		"hosts.toml: a server elsewhere replaces the origin (mirrors only)": {
			image: "quay.io/org/kmod:v1", s: Settings{Containerd: mirrorsOnly},
			want: []Endpoint{{Host: "m1.example", Repository: "org/kmod", APIRoot: "/prefix/v2", CAFiles: []string{"/etc/pki/m1.pem", "/etc/containerd/certs.d/quay.io/m1-extra.pem"}, Server: true, Source: hostsFile}},
		},
		"hosts.toml: a [host] table for the server is the server, tried once": {
			image: "quay.io/org/kmod:v1", s: Settings{Containerd: mustHosts(t, hostsFile, "server = \"http://quay.io\"\n[host.\"http://quay.io\"]\n  capabilities = [\"pull\", \"resolve\"]\n")},
			want: []Endpoint{{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", PlainHTTP: true, Server: true, Source: hostsFile}},
		},
		"hosts.toml without a server: the origin last": {
			image: "quay.io/org/kmod:v1", s: Settings{Containerd: defaultServer},
			want: []Endpoint{
				{Host: "m1.example", Repository: "org/kmod", APIRoot: "/v2", Mirror: true, Source: hostsFile},
				{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", Source: hostsFile},
			},
		},
		"registries.conf: longest prefix; digest-only mirrors skipped for a tag": {
			image: "quay.io/org/kmod:v1", s: Settings{Node: []RegistriesConf{conf}},
			want: []Endpoint{
				{Host: "plain.example:5000", Repository: "q/kmod", APIRoot: "/v2", PlainHTTP: true, SkipVerify: true, Mirror: true, Source: conf.File},
				{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", Source: conf.File},
			},
		},
		"registries.conf: a digest uses every mirror, the prefix rewritten": {
			image: "quay.io/org/kmod@" + digest, s: Settings{Node: []RegistriesConf{conf}},
			want: []Endpoint{
				{Host: "mirror.example", Repository: "quay-org/kmod", APIRoot: "/v2", Mirror: true, Source: conf.File},
				{Host: "plain.example:5000", Repository: "q/kmod", APIRoot: "/v2", PlainHTTP: true, SkipVerify: true, Mirror: true, Source: conf.File},
				{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", Source: conf.File},
			},
		},
		"registries.conf: tag-only mirror skipped for a digest": {
			image: "quay.io/other/kmod@" + digest, s: Settings{Node: []RegistriesConf{conf}},
			want: []Endpoint{{Host: "quay.io", Repository: "other/kmod", APIRoot: "/v2", Source: conf.File}},
		},
		"registries.conf: a prefix matches at a path boundary only": {
			image: "quay.io/organisation/kmod:v1", s: Settings{Node: []RegistriesConf{conf}},
			want: []Endpoint{
				{Host: "mirror.example", Repository: "quay/organisation/kmod", APIRoot: "/v2", Mirror: true, Source: conf.File},
				{Host: "quay.io", Repository: "organisation/kmod", APIRoot: "/v2", Source: conf.File},
			},
		},
		"registries.conf: Docker Hub is docker.io": {
			image: "busybox:1", s: Settings{Node: []RegistriesConf{conf}},
			want: []Endpoint{
				{Host: "hub-mirror.example", Repository: "library/busybox", APIRoot: "/v2", Mirror: true, Source: conf.File},
				{Host: name.DefaultRegistry, Repository: "library/busybox", APIRoot: "/v2", Source: conf.File},
			},
		},
		"registries.conf: a wildcard blocks": {
			image: "r.evil.example/kmod:v1", s: Settings{Node: []RegistriesConf{conf}}, blocked: true,
		},
		"the operator's registries.conf comes before the node's files": {
			image: "quay.io/org/blocked/kmod:v1", s: Settings{Operator: []RegistriesConf{operator}, Containerd: mirrors, Node: []RegistriesConf{conf}}, blocked: true,
		},
		"containerd before the node's registries.conf": {
			image: "quay.io/org/kmod:v1", s: Settings{Operator: []RegistriesConf{operator}, Containerd: defaultServer, Node: []RegistriesConf{conf}},
			want: []Endpoint{
				{Host: "m1.example", Repository: "org/kmod", APIRoot: "/v2", Mirror: true, Source: hostsFile},
				{Host: "quay.io", Repository: "org/kmod", APIRoot: "/v2", Source: hostsFile},
			},
		},
	}
	for n, tc := range cases {
		t.Run(n, func(t *testing.T) {
			ref, err := name.ParseReference(tc.image)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Plan(ref, tc.s, tc.module)
			var be *BlockedError
			if tc.blocked != errors.As(err, &be) {
				t.Fatalf("blocked: got error %v, want blocked %v", err, tc.blocked)
			}
			if err != nil && !tc.blocked {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	hosts := map[string]string{
		"not TOML":              `server = `,
		"a host without scheme": `[host."mirror.example"]`,
		"ca of the wrong type":  `[host."https://m.example"]` + "\n" + `ca = 5`,
		"too many hosts":        manyHosts(MaxMirrors + 1),
	}
	for n, body := range hosts {
		if _, err := ParseHostsTOML("/x/hosts.toml", []byte(body)); err == nil {
			t.Errorf("hosts.toml %s: no error", n)
		}
	}
	if _, err := ParseHostsTOML("/x/hosts.toml", []byte(manyHosts(MaxMirrors))); err != nil {
		t.Errorf("hosts.toml with %d hosts: %v", MaxMirrors, err)
	}
	confs := map[string]string{
		"no prefix nor location":  "[[registry]]\ninsecure = true",
		"wildcard with location":  "[[registry]]\nprefix = \"*.a.example\"\nlocation = \"b.example\"",
		"bad pull-from-mirror":    "[[registry]]\nlocation = \"a.example\"\n[[registry.mirror]]\nlocation = \"m.example\"\npull-from-mirror = \"some\"",
		"mirror without location": "[[registry]]\nlocation = \"a.example\"\n[[registry.mirror]]\ninsecure = true",
	}
	for n, body := range confs {
		if _, err := ParseRegistriesConf("/x/registries.conf", []byte(body)); err == nil {
			t.Errorf("registries.conf %s: no error", n)
		}
	}
}

func manyHosts(n int) string {
	var s string
	for i := range n {
		s += "[host.\"https://m" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ".example\"]\n"
	}
	return s
}
