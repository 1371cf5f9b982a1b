package worker

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/registry"
)

// closedHost returns a 127.0.0.1 address nothing listens on: an unreachable origin.
func closedHost(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// writeHostsTOML writes <configPath>/<host>/hosts.toml and returns configPath.
func writeHostsTOML(t *testing.T, configPath, host, body string) string {
	t.Helper()
	if configPath == "" {
		configPath = t.TempDir()
	}
	d := filepath.Join(configPath, host)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return configPath
}

func withSources(src registry.Sources) func(*Options) {
	return func(o *Options) { o.Registries = src }
}

// TestMirrorServesWhileTheOriginIsUnreachable: containerd's hosts.toml names a mirror for a
// registry that does not answer; the worker pulls from the mirror, by tag and by digest.
func TestMirrorServesWhileTheOriginIsUnreachable(t *testing.T) {
	mirror := newTestRegistry(t, registryOpts{})
	_, digest := mirror.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	origin := closedHost(t)
	cp := writeHostsTOML(t, "", origin, fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[2]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", origin, mirror.host))

	for _, ref := range []string{origin + "/kmod/test:v1", origin + "/kmod/test@" + digest.String()} {
		res := newTestWorker(t, newSandbox(t), newRecorder(t), withSources(registry.Sources{ContainerdConfigPath: cp})).Run(context.Background(), contract.ActionLoad, testConfig(ref))
		mustSucceed(t, res)
		if res.ImageDigest != digest.String() {
			t.Errorf("%s: digest %s, want %s", ref, res.ImageDigest, digest)
		}
	}
	if mirror.blobGets.Load() == 0 {
		t.Errorf("the mirror served no blob")
	}

	// Seeded fault: without the configuration the origin is all there is, and it fails naming it.
	res := newTestWorker(t, newSandbox(t), newRecorder(t)).Run(context.Background(), contract.ActionLoad, testConfig(origin+"/kmod/test:v1"))
	if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, origin) {
		t.Errorf("without hosts.toml: got %s %q, want ImagePull naming %s", res.Reason, res.Message, origin)
	}
}

// TestMirrorsInOrderThenOrigin: a mirror that lacks the image is skipped, the next one serves;
// when none has it, the message names every host tried, in order, with the config file.
func TestMirrorsInOrderThenOrigin(t *testing.T) {
	empty := newTestRegistry(t, registryOpts{})
	mirror := newTestRegistry(t, registryOpts{})
	origin := newTestRegistry(t, registryOpts{})
	ref, digest := origin.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	mirror.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	cp := writeHostsTOML(t, "", origin.host, fmt.Sprintf("[host.\"http://%s\"]\n[host.\"http://%s\"]\n", empty.host, mirror.host))

	res := newTestWorker(t, newSandbox(t), newRecorder(t), withSources(registry.Sources{ContainerdConfigPath: cp})).Run(context.Background(), contract.ActionLoad, testConfig(ref))
	mustSucceed(t, res)
	if res.ImageDigest != digest.String() || empty.requests.Load() == 0 || mirror.blobGets.Load() == 0 || origin.requests.Load() != 0 {
		t.Errorf("digest %s (want %s); requests: empty mirror %d, mirror blobs %d, origin %d; want the first mirror asked, the second serving, the origin untouched",
			res.ImageDigest, digest, empty.requests.Load(), mirror.blobGets.Load(), origin.requests.Load())
	}

	res = newTestWorker(t, newSandbox(t), newRecorder(t), withSources(registry.Sources{ContainerdConfigPath: cp})).Run(context.Background(), contract.ActionLoad, testConfig(origin.host+"/kmod/absent:v1"))
	t.Logf("message: %s", res.Message)
	want := []string{empty.host + " (mirror from " + cp, mirror.host + " (mirror", origin.host + " (origin", "image not found"}
	for _, w := range want {
		if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, w) {
			t.Errorf("got %s %q, want ImagePull naming %q", res.Reason, res.Message, w)
		}
	}
	if i, j := strings.Index(res.Message, empty.host), strings.Index(res.Message, origin.host+" (origin"); i < 0 || j < i {
		t.Errorf("the hosts are not named in the order tried: %q", res.Message)
	}
}

// TestMirrorServingAWrongDigestIsRejected: a mirror answers a digest reference with another
// image's manifest; go-containerregistry refuses it, the origin serves the right one, and with no
// origin the pull fails naming the mirror. Nothing of the wrong image reaches the cache.
func TestMirrorServingAWrongDigestIsRejected(t *testing.T) {
	good := image(t, kmodEntries(t, "opt"))
	bad := image(t, append(kmodEntries(t, "opt"), file("opt/evil", "x")))
	var badManifest []byte
	mirror := newTestRegistry(t, registryOpts{intercept: func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool {
		if !strings.Contains(r.URL.Path, "/manifests/sha256:") {
			return false
		}
		w.Header().Set("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
		_, _ = w.Write(badManifest)
		return true
	}})
	mirror.push(t, "kmod/test:bad", bad)
	m, err := bad.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	badManifest = m
	origin := newTestRegistry(t, registryOpts{})
	_, digest := origin.push(t, "kmod/test:v1", good)
	ref := origin.host + "/kmod/test@" + digest.String()
	hosts := fmt.Sprintf("[host.\"http://%s\"]\n  capabilities = [\"pull\"]\n", mirror.host)

	s := newSandbox(t)
	res := newTestWorker(t, s, newRecorder(t), withSources(registry.Sources{ContainerdConfigPath: writeHostsTOML(t, "", origin.host, hosts)})).Run(context.Background(), contract.ActionLoad, testConfig(ref))
	mustSucceed(t, res)
	if res.ImageDigest != digest.String() || mirror.requests.Load() == 0 || origin.blobGets.Load() == 0 {
		t.Errorf("digest %s (want %s), mirror requests %d, origin blob downloads %d: want the mirror asked and refused, the origin serving",
			res.ImageDigest, digest, mirror.requests.Load(), origin.blobGets.Load())
	}

	// The mirror alone (the hosts.toml server is the mirror): rejected.
	mirrorOnly := fmt.Sprintf("server = \"http://%s\"\n", mirror.host)
	s = newSandbox(t)
	m2 := newRecorder(t)
	res = newTestWorker(t, s, m2, withSources(registry.Sources{ContainerdConfigPath: writeHostsTOML(t, "", origin.host, mirrorOnly)})).Run(context.Background(), contract.ActionLoad, testConfig(ref))
	t.Logf("message: %s", res.Message)
	if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, mirror.host) || !strings.Contains(res.Message, "does not match") {
		t.Errorf("got %s %q, want ImagePull naming the mirror and the digest mismatch", res.Reason, res.Message)
	}
	if _, err := os.Stat(filepath.Join(s.cache, digest.Hex)); len(m2.calls) != 0 || err == nil {
		t.Errorf("a rejected manifest ran modprobe (%q) or reached the cache (%v)", m2.calls, listFiles(t, s.cache))
	}
}

// TestBlockedRegistry: registries.conf blocks the registry: no request is made and the failure
// names the file.
func TestBlockedRegistry(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	conf := filepath.Join(t.TempDir(), "registries.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "[[registry]]\nlocation = %q\nblocked = true\n", reg.host+"/kmod"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]registry.Sources{
		"node":     {NodeRegistriesConf: []string{conf}},
		"operator": {OperatorRegistriesConf: []string{conf, filepath.Join(t.TempDir(), "absent.conf")}},
	} {
		res := newTestWorker(t, newSandbox(t), newRecorder(t), withSources(src)).Run(context.Background(), contract.ActionLoad, testConfig(ref))
		t.Logf("%s: %s", name, res.Message)
		if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "blocked") || !strings.Contains(res.Message, conf) || reg.requests.Load() != 0 {
			t.Errorf("%s: got %s %q after %d requests, want ImagePull naming %s and no request", name, res.Reason, res.Message, reg.requests.Load(), conf)
		}
	}
	// Another repository of the same registry is not blocked.
	other, _ := reg.push(t, "other/test:v1", image(t, kmodEntries(t, "opt")))
	mustSucceed(t, newTestWorker(t, newSandbox(t), newRecorder(t), withSources(registry.Sources{NodeRegistriesConf: []string{conf}})).Run(context.Background(), contract.ActionLoad, testConfig(other)))
}

// TestRegistriesConfMirrorRewritesTheRepository: a registries.conf mirror whose location has a
// path serves the image under the rewritten repository.
func TestRegistriesConfMirrorRewritesTheRepository(t *testing.T) {
	mirror := newTestRegistry(t, registryOpts{})
	_, digest := mirror.push(t, "cache/org/kmod:v1", image(t, kmodEntries(t, "opt")))
	origin := closedHost(t)
	conf := filepath.Join(t.TempDir(), "registries.conf")
	body := fmt.Sprintf("[[registry]]\nprefix = %q\nlocation = %q\n[[registry.mirror]]\nlocation = %q\ninsecure = true\n", origin+"/org", origin+"/org", mirror.host+"/cache/org")
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	res := newTestWorker(t, newSandbox(t), newRecorder(t), withSources(registry.Sources{NodeRegistriesConf: []string{conf}})).Run(context.Background(), contract.ActionLoad, testConfig(origin+"/org/kmod:v1"))
	mustSucceed(t, res)
	if res.ImageDigest != digest.String() {
		t.Errorf("digest %s, want %s", res.ImageDigest, digest)
	}
}

// TestMirrorWithAnAPIRoot: a hosts.toml mirror URL with override_path serves the registry API
// under its own path.
func TestMirrorWithAnAPIRoot(t *testing.T) {
	const root = "/registry/api"
	var pushed atomic.Bool
	mirror := newTestRegistry(t, registryOpts{intercept: func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool {
		if !pushed.Load() {
			return false // the test's own push, through /v2
		}
		rest, ok := strings.CutPrefix(r.URL.Path, root)
		if !ok {
			http.NotFound(w, r)
			return true
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/v2" + rest
		inner.ServeHTTP(w, r2)
		return true
	}})
	mirror.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	pushed.Store(true)
	origin := closedHost(t)
	cp := writeHostsTOML(t, "", origin, fmt.Sprintf("[host.\"http://%s%s\"]\n  override_path = true\n", mirror.host, root))
	mustSucceed(t, newTestWorker(t, newSandbox(t), newRecorder(t), withSources(registry.Sources{ContainerdConfigPath: cp})).Run(context.Background(), contract.ActionLoad, testConfig(origin+"/kmod/test:v1")))
	if mirror.blobGets.Load() == 0 {
		t.Errorf("the mirror served no blob")
	}
}

// TestPrivateCA: a TLS registry whose certificate a private CA signed is trusted through the
// cluster CA bundle, through hosts.toml's ca, or through a certs.d directory; without any the
// pull fails with the certificate named.
func TestPrivateCA(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{tls: true})
	ref, digest := reg.push(t, "kmod/tls:v1", image(t, kmodEntries(t, "opt")))
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: reg.srv.Certificate().Raw})
	dir := t.TempDir()
	bundle := filepath.Join(dir, "ca-bundle.crt")
	if err := os.WriteFile(bundle, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	certsD := filepath.Join(dir, "certs.d")
	if err := os.MkdirAll(filepath.Join(certsD, reg.host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certsD, reg.host, "ca.crt"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cp := writeHostsTOML(t, "", reg.host, fmt.Sprintf("server = \"https://%s\"\nca = \"ca.crt\"\n", reg.host))
	if err := os.WriteFile(filepath.Join(cp, reg.host, "ca.crt"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	res := newTestWorker(t, newSandbox(t), newRecorder(t), func(o *Options) { o.Trust.BundleFiles = []string{filepath.Join(dir, "absent.crt")} }).Run(context.Background(), contract.ActionLoad, testConfig(ref))
	if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "certificate") {
		t.Errorf("no CA: got %s %q, want ImagePull about the certificate", res.Reason, res.Message)
	}
	for name, opt := range map[string]func(*Options){
		"cluster bundle": func(o *Options) { o.Trust.BundleFiles = []string{bundle} },
		"hosts.toml ca":  func(o *Options) { o.Registries.ContainerdConfigPath = cp },
		"certs.d dir":    func(o *Options) { o.Trust.CertsDirs = []string{certsD} },
	} {
		res := newTestWorker(t, newSandbox(t), newRecorder(t), opt).Run(context.Background(), contract.ActionLoad, testConfig(ref))
		if res.Outcome != contract.OutcomeSucceeded || res.ImageDigest != digest.String() {
			t.Errorf("%s: got %s %s %q, want the image pulled with the private CA", name, res.Outcome, res.Reason, res.Message)
		}
	}
}
