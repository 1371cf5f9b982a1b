package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
)

// The test binary stands in for buildkitd and buildctl when FAKE_BUILDKIT says which.
func TestMain(m *testing.M) {
	switch os.Getenv("FAKE_BUILDKIT") {
	case "buildkitd":
		fakeBuildkitd()
	case "buildctl":
		fakeBuildctl()
	default:
		os.Exit(m.Run())
	}
}

func flagValue(name string) string {
	for i, a := range os.Args {
		if a == name && i+1 < len(os.Args) {
			return os.Args[i+1]
		}
	}
	return ""
}

// fakeBuildkitd serves its --addr socket until SIGTERM, after recording its config; it logs its
// shutdown.
func fakeBuildkitd() {
	cfg, _ := os.ReadFile(flagValue("--config"))
	_ = os.WriteFile(os.Getenv("FAKE_RECORD")+".toml", cfg, 0o600)
	if os.Getenv("FAKE_DAEMON_FAILS") != "" {
		_, _ = os.Stderr.WriteString("buildkitd: no runc\n")
		os.Exit(1)
	}
	l, err := net.Listen("unix", strings.TrimPrefix(flagValue("--addr"), "unix://"))
	if err != nil {
		os.Exit(3)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	// As the real one writes when stopped while a build's session is open (measured in make e2e).
	_, _ = os.Stderr.WriteString("buildkitd: got SIGTERM/SIGINT, forcing shutdown\ngithub.com/moby/buildkit/util/appcontext.initContexts.func1.1\n\truntime/asm_amd64.s:1771\n")
	os.Exit(0)
}

// fakeBuildctl records its arguments and DOCKER_CONFIG, then succeeds (metadata with a digest) or
// fails with a log.
func fakeBuildctl() {
	cfg, _ := os.ReadFile(filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json"))
	rec, _ := json.Marshal(map[string]any{"args": os.Args[1:], "dockerConfig": os.Getenv("DOCKER_CONFIG"), "configJSON": string(cfg)})
	_ = os.WriteFile(os.Getenv("FAKE_RECORD")+".json", rec, 0o600)
	if os.Getenv("FAKE_BUILD_FAILS") != "" {
		_, _ = os.Stderr.WriteString(strings.Repeat("#3 [builder 2/4] RUN make\n", 5000) + "#3 ERROR: process \"make\" did not complete successfully: exit code: 2\n")
		os.Exit(1)
	}
	_ = os.WriteFile(flagValue("--metadata-file"), []byte(`{"containerimage.digest":"sha256:0123"}`), 0o600)
	os.Exit(0)
}

type fakeRun struct {
	opts   options
	args   []string
	record string
}

// setUp writes a Dockerfile and Secrets, and options running the fakes, from build.Pod's arguments.
func setUp(t *testing.T, r build.Request, dockerfile string) fakeRun {
	t.Helper()
	dir := t.TempDir()
	ctxDir := filepath.Join(dir, "ctx")
	if err := os.MkdirAll(ctxDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(dockerfile), 0o600); err != nil {
		t.Fatal(err)
	}
	pod, err := build.Pod(r)
	if err != nil {
		t.Fatal(err)
	}
	o, args, err := parseFlags(pod.Spec.Containers[0].Args, io.Discard)
	if err != nil {
		t.Fatalf("the builder refuses build.Pod's arguments %q: %v", pod.Spec.Containers[0].Args, err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o.dockerfileDir, o.stateDir, o.buildkitd, o.buildctl = ctxDir, filepath.Join(dir, "state"), self, self
	if o.dockerConfig != "" {
		o.dockerConfig = filepath.Join(dir, "pull-secret")
		writeFile(t, filepath.Join(o.dockerConfig, "config.json"), `{"auths":{"push.example.com:5000":{"username":"pusher","password":"p"}}}`)
	}
	if o.secretsDir != "" {
		o.secretsDir = filepath.Join(dir, "secrets")
		for _, f := range []string{"git/token", "git/..data/token", "netrc/.netrc"} {
			p := filepath.Join(o.secretsDir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("s"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	record := filepath.Join(dir, "record")
	t.Setenv("FAKE_RECORD", record)
	t.Setenv("TMPDIR", dir)
	return fakeRun{opts: o, args: args, record: record}
}

func request() build.Request {
	return build.Request{Namespace: "drivers", ModuleName: "nic", PodName: "p", Kernel: "6.1.0-56-amd64",
		Image: "push.example.com:5000/nic:6.1.0-56-amd64", BuilderImage: "b", DockerfileConfigMap: "cm",
		BuildArgs: []kmmv1beta1.BuildArg{{Name: "BASE", Value: "base.example.com/toolchain:12"}},
		Owner:     metav1.OwnerReference{Name: "nic", UID: "u"}}
}

const dockerfile = "ARG BASE=docker.io/library/debian:12\nFROM ${BASE} AS builder\nRUN make\nFROM scratch\nCOPY --from=builder /a /a\n"

// buildctlRecord is what the fake buildctl recorded.
func buildctlRecord(t *testing.T, record string) (args []string, dockerConfig string) {
	t.Helper()
	data, err := os.ReadFile(record + ".json")
	if err != nil {
		t.Fatalf("buildctl did not run: %v", err)
	}
	var rec struct {
		Args         []string `json:"args"`
		DockerConfig string   `json:"dockerConfig"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.Args, rec.DockerConfig
}

func TestRunBuildsPushesAndReportsTheDigest(t *testing.T) {
	r := request()
	r.PullSecret = &corev1.LocalObjectReference{Name: "pull"}
	r.Secrets = []corev1.LocalObjectReference{{Name: "git"}}
	r.BaseImageRegistryTLS.Insecure = true
	r.PushRegistryTLS.InsecureSkipTLSVerify = true
	f := setUp(t, r, dockerfile)
	t.Setenv("FAKE_BUILDKIT", "")
	res := runWithFakes(t, f)
	if !res.Succeeded() || res.Digest != "sha256:0123" || res.Image != r.Image {
		t.Fatalf("result %+v", res)
	}
	args, _ := buildctlRecord(t, f.record)
	if auths := recordedAuths(t, f.record); auths["push.example.com:5000"] != "pusher" {
		t.Errorf("buildctl's credentials %v, want the pull secret's for push.example.com:5000", auths)
	}
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"--opt build-arg:BASE=base.example.com/toolchain:12", "--opt build-arg:KERNEL_FULL_VERSION=6.1.0-56-amd64",
		"--opt build-arg:MOD_NAME=nic", "--opt build-arg:MOD_NAMESPACE=drivers",
		"--output type=image,name=push.example.com:5000/nic:6.1.0-56-amd64,push=true,registry.insecure=true",
		"--secret id=git/token,src=" + filepath.Join(f.opts.secretsDir, "git/token"),
		"--frontend dockerfile.v0",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("buildctl args lack %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "..data") || strings.Contains(joined, ".netrc") {
		t.Errorf("buildctl given the kubelet's dot entries: %s", joined)
	}
	cfg, err := os.ReadFile(f.record + ".toml")
	if err != nil {
		t.Fatal(err)
	}
	want := "[worker.oci]\n  enabled = true\n  snapshotter = \"auto\"\n  rootless = true\n  binary = \"<dir of buildkitd>/kmm-runc\"\n[worker.containerd]\n  enabled = false\n" +
		"[registry.\"base.example.com\"]\n  http = true\n  insecure = false\n" +
		"[registry.\"push.example.com:5000\"]\n  http = false\n  insecure = true\n"
	got := regexp.MustCompile(`binary = ".*/kmm-runc"`).ReplaceAllString(string(cfg), `binary = "<dir of buildkitd>/kmm-runc"`)
	if got != want {
		t.Errorf("buildkitd.toml:\n%s\nwant:\n%s", cfg, want)
	}
}

func TestRunReportsTheBuildLogsTail(t *testing.T) {
	f := setUp(t, request(), dockerfile)
	t.Setenv("FAKE_BUILD_FAILS", "1")
	res := runWithFakes(t, f)
	if res.Succeeded() || !strings.Contains(res.Message, "buildctl") {
		t.Fatalf("result %+v", res)
	}
	data, err := res.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := build.ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got.Log, "did not complete successfully: exit code: 2\n") {
		t.Errorf("the termination message's log does not end with the failure: ...%q", got.Log[max(0, len(got.Log)-80):])
	}
}

func TestRunReportsADaemonThatDoesNotStart(t *testing.T) {
	f := setUp(t, request(), dockerfile)
	t.Setenv("FAKE_DAEMON_FAILS", "1")
	res := runWithFakes(t, f)
	if res.Succeeded() || !strings.Contains(res.Message, "buildkitd exited") || !strings.Contains(res.Log, "no runc") {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(f.record + ".json"); err == nil {
		t.Error("buildctl ran without a daemon")
	}
}

// runWithFakes runs run with the test binary as buildkitd and buildctl.
func runWithFakes(t *testing.T, f fakeRun) build.Result {
	t.Helper()
	wrap := filepath.Join(t.TempDir(), "fake")
	if err := os.MkdirAll(wrap, 0o750); err != nil {
		t.Fatal(err)
	}
	f.opts.buildkitd = fakeBinary(t, wrap, "buildkitd")
	f.opts.buildctl = fakeBinary(t, wrap, "buildctl")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return run(ctx, f.opts, f.args, io.Discard)
}

// fakeBinary is a link to the test binary that knows its role from its name's env (set by run
// through the environment of each command: FAKE_BUILDKIT is read by TestMain).
func fakeBinary(t *testing.T, dir, role string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, role)
	script := "#!/bin/sh\nFAKE_BUILDKIT=" + role + " exec " + self + " \"$@\"\n"
	if err := os.WriteFile(p, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFromImages(t *testing.T) {
	tests := []struct {
		name, dockerfile string
		args             []string
		want             []string
	}{
		{"an ARG default", "ARG BASE=reg.io/a:1\nFROM $BASE\n", nil, []string{"reg.io/a:1"}},
		{"a build argument over the default", "ARG BASE=reg.io/a:1\nFROM ${BASE} AS b\n", []string{"BASE=other.io/b:2"}, []string{"other.io/b:2"}},
		{"stages and scratch are not images", "FROM reg.io/a AS build\nFROM build\nFROM scratch\nCOPY --from=build / /\n", nil, []string{"reg.io/a"}},
		{"--platform is skipped", "from --platform=linux/amd64 reg.io/a\n", nil, []string{"reg.io/a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fromImages(tt.dockerfile, tt.args); !slices.Equal(got, tt.want) {
				t.Errorf("fromImages = %q, want %q", got, tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// recordedAuths are the user names of the config.json buildctl was given, by key.
func recordedAuths(t *testing.T, record string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(record + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		ConfigJSON string `json:"configJSON"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	data := []byte(rec.ConfigJSON)
	var cfg struct {
		Auths map[string]struct {
			Username string `json:"username"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range cfg.Auths {
		out[k] = v.Username
	}
	return out
}

// TestBuildHonoursTheWorkersRegistrySettings: the build pod takes the worker's registry flags
// (the operator's registries.conf with a mirror of Docker Hub, a CA bundle, a certs.d directory,
// the service account's pull secrets) and buildkitd gets them: the mirror as Docker Hub's mirror,
// the CA files for the hosts they are for, and the mirror's credentials in buildctl's config.
func TestBuildHonoursTheWorkersRegistrySettings(t *testing.T) {
	dir := t.TempDir()
	conf, bundle, certs, sa := filepath.Join(dir, "registries.conf"), filepath.Join(dir, "ca-bundle.crt"), filepath.Join(dir, "certs.d"), filepath.Join(dir, "sa")
	writeFile(t, conf, "[[registry]]\nprefix = \"docker.io\"\nlocation = \"docker.io\"\n[[registry.mirror]]\nlocation = \"mirror.example:5000/hub\"\n")
	writeFile(t, bundle, "bundle")
	writeFile(t, filepath.Join(certs, "push.example.com:5000", "ca.crt"), "push ca")
	writeFile(t, filepath.Join(sa, "00.dockerconfigjson"), `{"auths":{"mirror.example:5000":{"username":"mirror-user","password":"p"}}}`)
	r := request()
	r.BuildArgs = nil // FROM docker.io/library/debian:12
	r.Registry = build.PodParts{Args: []string{"--operator-registries-conf", conf, "--ca-bundle", bundle, "--certs-dir", certs, "--pull-secret-dir", sa}}
	f := setUp(t, r, dockerfile)
	if res := runWithFakes(t, f); !res.Succeeded() {
		t.Fatalf("result %+v", res)
	}
	cfg, err := os.ReadFile(f.record + ".toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"[registry.\"docker.io\"]\n  mirrors = [\"mirror.example:5000/hub\"]\n  http = false\n  insecure = false\n  ca = [" + strconv.Quote(bundle) + "]\n",
		"[registry.\"mirror.example:5000\"]\n  http = false\n  insecure = false\n  ca = [" + strconv.Quote(bundle) + "]\n",
		"[registry.\"push.example.com:5000\"]\n  http = false\n  insecure = false\n  ca = [" + strconv.Quote(bundle) + ", " + strconv.Quote(filepath.Join(certs, "push.example.com:5000", "ca.crt")) + "]\n",
	} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("buildkitd.toml lacks\n%s\ngot:\n%s", want, cfg)
		}
	}
	if auths := recordedAuths(t, f.record); auths["mirror.example:5000"] != "mirror-user" {
		t.Errorf("buildctl's credentials %v, want the service account's for the mirror", auths)
	}
}

func TestParseFlagsRefuses(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--image", "r/m:1", "--build-arg", "NOVALUE"},
		{"--image", "r/m:1", "--timeout", "0s"},
		{"--image", "r/m:1", "extra"},
	} {
		if _, _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestDaemonConfigUnprivileged(t *testing.T) {
	got := daemonConfig(nil, true, "/usr/local/bin/kmm-runc")
	want := "[worker.oci]\n  enabled = true\n  snapshotter = \"auto\"\n  rootless = true\n  binary = \"/usr/local/bin/kmm-runc\"\n[worker.containerd]\n  enabled = false\n"
	if got != want {
		t.Errorf("buildkitd.toml:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(daemonConfig(nil, false, "/usr/local/bin/kmm-runc"), "rootless") {
		t.Error("a privileged pod's buildkitd gets the rootless worker")
	}
}

func TestRuncArgs(t *testing.T) {
	tests := []struct{ in, want []string }{
		{[]string{"--log", "/x/log.json", "--log-format", "json", "run", "--bundle", "/b", "id"},
			[]string{"runc", "--rootless=true", "--log", "/x/log.json", "--log-format", "json", "run", "--no-new-keyring", "--no-pivot", "--bundle", "/b", "id"}},
		{[]string{"--root", "/r", "create", "id"}, []string{"runc", "--rootless=true", "--root", "/r", "create", "--no-new-keyring", "--no-pivot", "id"}},
		{[]string{"--log", "run", "kill", "id", "run"}, []string{"runc", "--rootless=true", "--log", "run", "kill", "id", "run"}},
		{[]string{"--version"}, []string{"runc", "--rootless=true", "--version"}},
	}
	for _, tt := range tests {
		if got := runcArgs(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("runcArgs(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
