package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/registry"
)

// The test binary is also a kubelet credential provider plugin: run with
// KMM_TEST_CREDENTIAL_PROVIDER set, it answers one CredentialProviderRequest with the user kmm and
// the password of its --token argument, and appends the image it was asked about to the file
// KMM_TEST_PROVIDER_LOG.
func TestMain(m *testing.M) {
	if os.Getenv("KMM_TEST_CREDENTIAL_PROVIDER") != "" {
		os.Exit(credentialProviderPlugin(os.Args[1:], os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

func credentialProviderPlugin(args []string, in io.Reader, out io.Writer) int {
	var req struct{ APIVersion, Kind, Image string }
	if err := json.NewDecoder(io.LimitReader(in, 1<<20)).Decode(&req); err != nil || req.APIVersion != registry.ProviderAPIVersion || req.Kind != "CredentialProviderRequest" {
		fmt.Fprintf(os.Stderr, "bad request %+v: %v\n", req, err)
		return 1
	}
	if len(args) != 2 || args[0] != "--token" {
		fmt.Fprintln(os.Stderr, "usage: --token <token>")
		return 1
	}
	if f, err := os.OpenFile(os.Getenv("KMM_TEST_PROVIDER_LOG"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		_, _ = fmt.Fprintln(f, req.Image)
		_ = f.Close()
	}
	host, _, _ := strings.Cut(req.Image, "/")
	resp := map[string]any{
		"apiVersion": registry.ProviderAPIVersion, "kind": "CredentialProviderResponse",
		"cacheKeyType": "Registry", "cacheDuration": "1m",
		"auth": map[string]any{host: map[string]string{"username": "kmm", "password": args[1]}},
	}
	if err := json.NewEncoder(out).Encode(resp); err != nil {
		return 1
	}
	return 0
}

// providerKeychain configures this test binary as the plugin for images of host, issuing token.
func providerKeychain(t *testing.T, host, token string) (*registry.ProviderKeychain, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(bin, "kmm-test-provider")); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "requests.log")
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: kmm-test-provider
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: [%q]
  defaultCacheDuration: 10m
  args: ["--token", %q]
  env:
  - {name: KMM_TEST_CREDENTIAL_PROVIDER, value: "1"}
  - {name: KMM_TEST_PROVIDER_LOG, value: %q}
`, host, token, log)
	file := filepath.Join(dir, "credential-providers.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := registry.LoadCredentialProviders(file, bin)
	if err != nil {
		t.Fatal(err)
	}
	return kc, log
}

// TestCredentialProviderPlugin: the registry requires a token only the plugin issues. The plugin's
// token pulls; a wrong token fails as an authentication failure; and the cache filled with the
// plugin's credentials serves neither a run without credentials nor one with a wrong token.
func TestCredentialProviderPlugin(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{user: "kmm", password: "t0ken"})
	ref, digest := reg.push(t, "kmod/private:v1", image(t, kmodEntries(t, "opt")))
	good, log := providerKeychain(t, reg.host, "t0ken")
	s := newSandbox(t)

	res := newTestWorker(t, s, newRecorder(t), func(o *Options) { o.Keychain = good }).Run(context.Background(), contract.ActionLoad, testConfig(ref))
	mustSucceed(t, res)
	if res.ImageDigest != digest.String() {
		t.Errorf("digest %s, want %s", res.ImageDigest, digest)
	}
	asked, err := os.ReadFile(log)
	if err != nil || !strings.HasPrefix(string(asked), reg.host+"/kmod/private\n") {
		t.Errorf("the plugin was asked %q (%v), want %s/kmod/private", asked, err, reg.host)
	}
	if n := strings.Count(string(asked), "\n"); n != 1 {
		t.Errorf("the plugin ran %d times, want once (its response is cached for the run)", n)
	}

	wrong, _ := providerKeychain(t, reg.host, "expired")
	for name, opt := range map[string]func(*Options){
		"no credentials": func(*Options) {},
		"wrong token":    func(o *Options) { o.Keychain = wrong },
	} {
		for _, sb := range map[string]sandbox{"empty cache": newSandbox(t), "cache filled with the plugin's credentials": s} {
			m := newRecorder(t)
			res := newTestWorker(t, sb, m, opt).Run(context.Background(), contract.ActionLoad, testConfig(ref))
			if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "authentication failed") || len(m.calls) != 0 {
				t.Errorf("%s: got %s %q after modprobe %q, want ImagePull (authentication) and nothing loaded", name, res.Reason, res.Message, m.calls)
			}
		}
	}

	// An image the plugin does not match: the plugin is not run.
	other := newTestRegistry(t, registryOpts{})
	otherRef, _ := other.push(t, "kmod/public:v1", image(t, kmodEntries(t, "opt")))
	_ = os.Remove(log)
	mustSucceed(t, newTestWorker(t, newSandbox(t), newRecorder(t), func(o *Options) { o.Keychain = good }).Run(context.Background(), contract.ActionLoad, testConfig(otherRef)))
	if _, err := os.Stat(log); err == nil {
		t.Errorf("the plugin ran for an image its matchImages do not match")
	}
}

// TestServiceAccountPullSecrets: the pull secrets of a projected volume (the service account's
// imagePullSecrets, flat files beside the volume's ..data entries) give credentials in name order.
func TestServiceAccountPullSecrets(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{user: "kmm", password: "s3cret"})
	ref, _ := reg.push(t, "kmod/private:v1", image(t, kmodEntries(t, "opt")))
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_11_26_14_00_00.000")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(data, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(filepath.Base(data), name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	other, _ := os.ReadFile(writeDockerConfig(t, "elsewhere.example", "x", "y"))
	right, _ := os.ReadFile(writeDockerConfig(t, reg.host, "kmm", "s3cret"))
	write("0.dockerconfigjson", string(other))
	legacy := strings.TrimSuffix(strings.TrimPrefix(string(right), `{"auths":`), "}")
	write("1.dockercfg", legacy)

	kc, err := ReadKeychainDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustSucceed(t, newTestWorker(t, newSandbox(t), newRecorder(t), func(o *Options) { o.Keychain = kc }).Run(context.Background(), contract.ActionLoad, testConfig(ref)))

	if err := os.Remove(filepath.Join(dir, "1.dockercfg")); err != nil {
		t.Fatal(err)
	}
	kc, err = ReadKeychainDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	res := newTestWorker(t, newSandbox(t), newRecorder(t), func(o *Options) { o.Keychain = kc }).Run(context.Background(), contract.ActionLoad, testConfig(ref))
	if res.Reason != contract.ReasonImagePull {
		t.Errorf("without the right secret: got %s %q, want ImagePull", res.Reason, res.Message)
	}
	if _, err := ReadKeychainDir(filepath.Join(dir, "absent")); err != nil {
		t.Errorf("a missing directory: %v", err)
	}
}
