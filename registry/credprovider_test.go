package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

func TestURLMatch(t *testing.T) {
	cases := []struct {
		glob, image string
		want        bool
	}{
		{"*.dkr.ecr.*.amazonaws.com", "123.dkr.ecr.eu-west-1.amazonaws.com/kmod", true},
		{"*.dkr.ecr.*.amazonaws.com", "dkr.ecr.eu-west-1.amazonaws.com/kmod", false},
		{"*.example.com", "a.b.example.com/x", false},
		{"*.example.com", "a.example.com/x", true},
		{"registry.example:5000", "registry.example:5000/x", true},
		{"registry.example:5000", "registry.example/x", false},
		{"registry.example", "registry.example:5000/x", false},
		{"registry.example/team", "registry.example/team/kmod", true},
		{"registry.example/team", "registry.example/other/kmod", false},
		{"*-docker.pkg.dev", "europe-docker.pkg.dev/p/r/kmod", true},
	}
	for _, tc := range cases {
		if got := URLMatch(tc.glob, tc.image); got != tc.want {
			t.Errorf("URLMatch(%q, %q) = %v, want %v", tc.glob, tc.image, got, tc.want)
		}
	}
}

// scriptProvider writes a CredentialProviderConfig with one plugin, a shell script of body.
func scriptProvider(t *testing.T, match, body string) *ProviderKeychain {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plugin"), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil { // #nosec G306 -- an executable test plugin
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: plugin\n  apiVersion: %s\n  matchImages: [%q]\n", ProviderAPIVersion, match)
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := LoadCredentialProviders(file, dir)
	if err != nil {
		t.Fatal(err)
	}
	kc.timeout = 500 * time.Millisecond
	return kc
}

func TestCredentialProviderFailures(t *testing.T) {
	const ok = `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{"reg.example/team":{"username":"u","password":"team"},"reg.example":{"username":"u","password":"all"}}}`
	cases := map[string]struct{ body, want string }{
		"most specific auth key": {"cat >/dev/null; echo '" + ok + "'", "team"},
		"plugin fails":           {"echo 'no token for you' >&2; exit 3", "exit status 3: no token for you"},
		"too slow":               {"sleep 5", "no answer within"},
		"response too large":     {"head -c 70000 /dev/zero | tr '\\0' 'x'", "larger than"},
		"wrong kind":             {`echo '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"Other","cacheKeyType":"Image"}'`, "want credentialprovider.kubelet.k8s.io/v1 CredentialProviderResponse"},
		"missing cacheKeyType":   {`echo '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse"}'`, "cacheKeyType"},
		"not JSON":               {"echo hello", "malformed response"},
	}
	repo, err := name.NewRepository("reg.example/team/kmod")
	if err != nil {
		t.Fatal(err)
	}
	for n, tc := range cases {
		t.Run(n, func(t *testing.T) {
			start := time.Now()
			auth, err := scriptProvider(t, "reg.example", tc.body).Resolve(repo)
			if time.Since(start) > 3*time.Second {
				t.Errorf("took %s: the timeout did not cut the plugin", time.Since(start))
			}
			if err != nil {
				if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "credential provider plugin") {
					t.Errorf("error %q, want it to name the plugin and say %q", err, tc.want)
				}
				return
			}
			cfg, err := auth.Authorization()
			if err != nil || cfg.Password != tc.want {
				t.Errorf("password %q (%v), want %q", cfg.Password, err, tc.want)
			}
		})
	}
	// An image no matchImages pattern matches is anonymous, without running the plugin.
	other, _ := name.NewRepository("elsewhere.example/kmod")
	if auth, err := scriptProvider(t, "reg.example", "exit 1").Resolve(other); err != nil || auth != authn.Anonymous {
		t.Errorf("unmatched image: %v %v, want anonymous", auth, err)
	}
}

func TestParseCredentialProviderConfigErrors(t *testing.T) {
	head := "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n"
	cases := map[string]string{
		"wrong kind":       "apiVersion: v1\nkind: ConfigMap\n",
		"path in the name": head + "- {name: ../x, apiVersion: " + ProviderAPIVersion + ", matchImages: [a.example]}\n",
		"old protocol":     head + "- {name: x, apiVersion: credentialprovider.kubelet.k8s.io/v1alpha1, matchImages: [a.example]}\n",
		"no matchImages":   head + "- {name: x, apiVersion: " + ProviderAPIVersion + "}\n",
	}
	for n, body := range cases {
		if _, err := ParseCredentialProviderConfig([]byte(body)); err == nil {
			t.Errorf("%s: accepted", n)
		}
	}
}
