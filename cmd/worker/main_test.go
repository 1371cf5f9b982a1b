package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kmm-project/kmm/contract"
)

const kernel = "6.1.0-kmmcmd"

func tool(t testing.TB, name, pkg string) string {
	t.Helper()
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Join(d, name)
		}
	}
	t.Fatalf("%s is missing: install the Debian package %q", name, pkg)
	return ""
}

// pushKmodImage builds a one-module kmod image (gcc, depmod) and pushes it to a loopback registry
// behind basic auth kmm:pw; it returns the image reference and the registry host.
func pushKmodImage(t testing.TB) (string, string) {
	t.Helper()
	img := kmodImage(t)
	host := authRegistry(t)
	return pushTo(t, host, "kmod/cmd:v1", img), host
}

// kmodImage builds a one-module kmod image with gcc and depmod.
func kmodImage(t testing.TB) v1.Image {
	t.Helper()
	src := t.TempDir()
	modDir := filepath.Join(src, "lib/modules", kernel, "extra")
	if err := os.MkdirAll(modDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(t.TempDir(), "m.c")
	code := `int kmm_cmd_fn(void) { return 0; }
static const char n[] __attribute__((section(".modinfo"), used, aligned(1))) = "name=kmm_cmd";
static const char v[] __attribute__((section(".modinfo"), used, aligned(1))) = "vermagic=` + kernel + ` SMP mod_unload ";
`
	if err := os.WriteFile(c, []byte(code), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool(t, "gcc", "gcc"), "-c", "-o", filepath.Join(modDir, "kmm_cmd.ko"), c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v: %s", err, out)
	}
	if out, err := exec.Command(tool(t, "depmod", "kmod"), "-b", src, kernel).CombinedOutput(); err != nil {
		t.Fatalf("depmod: %v: %s", err, out)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(filepath.Join(src, "lib"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: "opt/" + rel, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil || tw.Close() != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// authRegistry starts a loopback registry behind basic auth kmm:pw and returns its host.
func authRegistry(t testing.TB) string {
	t.Helper()
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "kmm" || p != "pw" {
			w.Header().Set("WWW-Authenticate", `Basic realm="t"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// pushTo pushes img as host/repo and returns the reference.
func pushTo(t testing.TB, host, repo string, img v1.Image) string {
	t.Helper()
	ref := host + "/" + repo
	tag, _ := name.ParseReference(ref)
	if err := remote.Write(tag, img, remote.WithAuth(&authn.Basic{Username: "kmm", Password: "pw"})); err != nil {
		t.Fatal(err)
	}
	return ref
}

// env is a sandbox for one command run.
type env struct {
	dir, config, secret, hostRoot, cache, termLog string
}

func newEnv(t testing.TB, configJSON string) env {
	t.Helper()
	d := t.TempDir()
	e := env{dir: d, config: filepath.Join(d, "config"), secret: filepath.Join(d, "secret.json"), hostRoot: filepath.Join(d, "host"),
		cache: filepath.Join(d, "cache"), termLog: filepath.Join(d, "termination-log")}
	if err := os.MkdirAll(filepath.Join(e.hostRoot, "proc/sys/kernel/random"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.hostRoot, "proc/sys/kernel/random/boot_id"), []byte("boot-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.config, []byte(configJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e env) args(action string, extra ...string) []string {
	return append([]string{action, "--config", e.config, "--cache-dir", e.cache, "--host-root", e.hostRoot,
		"--termination-log", e.termLog, "--dry-run", "--log-console"}, extra...)
}

func (e env) result(t testing.TB) contract.Result {
	t.Helper()
	data, err := os.ReadFile(e.termLog)
	if err != nil {
		t.Fatalf("no termination message: %v", err)
	}
	res, err := contract.ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestLoadAndUnloadEndToEnd(t *testing.T) {
	ref, host := pushKmodImage(t)
	e := newEnv(t, fmt.Sprintf(`{"namespace":"ns","name":"m","config":{"kernelVersion":%q,"containerImage":%q,"modprobe":{"moduleName":"kmm_cmd"}}}`, kernel, ref))
	auth := base64.StdEncoding.EncodeToString([]byte("kmm:pw"))
	if err := os.WriteFile(e.secret, fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{"load", "unload"} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), e.args(action, "--pull-secret", e.secret), &stdout, &stderr)
		res := e.result(t)
		if code != exitSucceeded || res.Outcome != contract.OutcomeSucceeded || res.Action != contract.Action(action) ||
			res.BootID != "boot-1" || !strings.HasPrefix(res.ImageDigest, "sha256:") || res.KernelModule != "kmm_cmd" {
			t.Fatalf("%s: exit %d, result %+v\nlog: %s", action, code, res, stderr.String())
		}
		if strings.TrimSpace(stdout.String()) != mustRead(t, e.termLog) {
			t.Errorf("%s: stdout %q should be the result", action, stdout.String())
		}
		if action == "load" && !strings.Contains(stderr.String(), "insmod "+e.cache) {
			t.Errorf("the dry-run modprobe output should be logged: %s", stderr.String())
		}
	}
}

func mustRead(t *testing.T, f string) string {
	t.Helper()
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestFailuresWriteAClassifiedResult(t *testing.T) {
	ref, _ := pushKmodImage(t)
	good := fmt.Sprintf(`{"namespace":"ns","name":"m","config":{"kernelVersion":%q,"containerImage":%q,"modprobe":{"moduleName":"kmm_cmd"}}}`, kernel, ref)
	blocking := filepath.Join(t.TempDir(), "registries.conf")
	host, _, _ := strings.Cut(ref, "/")
	if err := os.WriteFile(blocking, fmt.Appendf(nil, "[[registry]]\nlocation = %q\nblocked = true\n", host), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		config string
		extra  []string
		reason contract.Reason
		want   string
	}{
		"malformed config":    {`{"namespace": "ns", "config": `, nil, contract.ReasonInvalidConfig, "malformed config"},
		"kernel with a slash": {strings.Replace(good, kernel, "6.1/../x", 1), nil, contract.ReasonInvalidConfig, "not a kernel version"},
		"firmwarePath /":      {strings.Replace(good, `"moduleName":"kmm_cmd"`, `"moduleName":"kmm_cmd","firmwarePath":"/"`, 1), nil, contract.ReasonInvalidConfig, "firmwarePath"},
		"no credentials":      {good, nil, contract.ReasonImagePull, "authentication failed"},
		"missing pull secret": {good, []string{"--pull-secret", "/nonexistent/secret"}, contract.ReasonImagePull, "reading the pull secret"},
		"blocked registry":    {good, []string{"--registries-conf", "/nonexistent.conf," + blocking}, contract.ReasonImagePull, "blocked by " + blocking},
		"operator's config":   {good, []string{"--operator-registries-conf", blocking, "--ca-bundle", "/nonexistent.crt"}, contract.ReasonImagePull, "blocked by " + blocking},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, tc.config)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), e.args("load", tc.extra...), &stdout, &stderr)
			res := e.result(t)
			if code != exitFailed || res.Outcome != contract.OutcomeFailed || res.Reason != tc.reason || !strings.Contains(res.Message, tc.want) {
				t.Errorf("exit %d, result %+v; want exit 1, %s saying %q", code, res, tc.reason, tc.want)
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	e := newEnv(t, "{}")
	cases := map[string]struct {
		args []string
		want string
	}{
		"no action":           {[]string{"--config", e.config}, "must be load, unload or reload"},
		"unknown action":      {[]string{"restart", "--config", e.config}, `got "restart"`},
		"no config":           {[]string{"load"}, "--config is required"},
		"dry run on the host": {[]string{"load", "--config", e.config, "--dry-run"}, "--dry-run needs --host-root"},
		"unknown flag":        {[]string{"load", "--colour"}, "flag provided but not defined"},
		"extra arguments":     {[]string{"load", "--config", e.config, "x"}, "unexpected arguments"},
		"bad log level":       {[]string{"load", "--config", e.config, "--log-level", "loud", "--termination-log", e.termLog}, "unknown log level"},
	}
	for name, tc := range cases {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 saying %q", name, code, stderr.String(), tc.want)
		}
	}
	if _, err := os.Stat(e.termLog); !os.IsNotExist(err) {
		t.Errorf("a usage error wrote a result")
	}
	// The action may also come after the flags.
	f, err := parseFlags([]string{"--config", "c", "unload"}, io.Discard)
	if err != nil || f.action != contract.ActionUnload || f.hostRoot != "/" || f.terminationLog != "/dev/termination-log" {
		t.Errorf("flags %+v, %v", f, err)
	}
}

func TestUnwritableTerminationLog(t *testing.T) {
	e := newEnv(t, "{")
	var stdout, stderr bytes.Buffer
	args := []string{"load", "--config", e.config, "--host-root", e.hostRoot, "--dry-run", "--termination-log", filepath.Join(e.dir, "missing", "log")}
	if code := run(context.Background(), args, &stdout, &stderr); code != exitResultWrite || !strings.Contains(stderr.String(), "writing the result") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// TestTimeoutWritesAClassifiedResult: with --timeout, a registry that never answers makes the
// worker write an ImagePull result saying it timed out, soon after the timeout.
func TestTimeoutWritesAClassifiedResult(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/kmod/stall:v1"
	e := newEnv(t, fmt.Sprintf(`{"namespace":"ns","name":"m","config":{"kernelVersion":%q,"containerImage":%q,"modprobe":{"moduleName":"kmm_cmd"}}}`, kernel, ref))
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run(context.Background(), e.args("load", "--timeout", "1s"), &stdout, &stderr)
	elapsed := time.Since(start)
	res := e.result(t)
	if code != exitFailed || res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "timed out after 1s") || elapsed > 10*time.Second {
		t.Errorf("exit %d after %v, result %+v; want exit 1 with ImagePull saying it timed out after 1s", code, elapsed, res)
	}
	f, err := parseFlags([]string{"load", "--config", "c"}, io.Discard)
	if err != nil || f.timeout != contract.DefaultTimeout {
		t.Errorf("default timeout %v (%v), want %v", f.timeout, err, contract.DefaultTimeout)
	}
	if _, err := parseFlags([]string{"load", "--config", "c", "--timeout", "0s"}, io.Discard); err == nil {
		t.Errorf("a zero timeout was accepted")
	}
}
