package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/registry"
)

// maxLogBytes is the tail of the build log kept for the result.
const maxLogBytes = 64 << 10

// daemonStartTimeout bounds buildkitd's start (under a second measured).
const daemonStartTimeout = time.Minute

// run builds and pushes, and says what happened.
func run(ctx context.Context, o options, args []string, logOut io.Writer) build.Result {
	res := build.Result{Image: o.image}
	log := &tailBuffer{max: maxLogBytes}
	out := io.MultiWriter(logOut, log)
	fail := func(err error) build.Result {
		res.Message, res.Log = err.Error(), log.String()
		return res
	}
	dockerfile, err := readDockerfile(o.dockerfileDir)
	if err != nil {
		return fail(fmt.Errorf("reading the Dockerfile: %w", err))
	}
	hosts, eps, notes, err := daemonRegistries(dockerfile, args, o.image,
		registry.ModuleTLS{Insecure: o.baseInsecure, SkipVerify: o.baseSkipVerify},
		registry.ModuleTLS{Insecure: o.pushInsecure, SkipVerify: o.pushSkipVerify}, o.registry)
	if err != nil {
		return fail(fmt.Errorf("the registry settings: %w", err))
	}
	for _, n := range notes {
		_, _ = fmt.Fprintln(out, n)
	}
	work, err := os.MkdirTemp("", "builder-")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(work) }()
	if o.dockerConfig, err = writeDockerConfig(work, o, eps); err != nil {
		return fail(fmt.Errorf("the registry credentials: %w", err))
	}
	stop, err := startDaemon(ctx, o, work, daemonConfig(hosts, o.unprivileged, filepath.Join(filepath.Dir(o.buildkitd), runcWrapper)), out)
	if err != nil {
		return fail(fmt.Errorf("starting buildkitd: %w", err))
	}
	digest, err := buildAndPush(ctx, o, args, work, out)
	// The log's tail as the build ended: buildkitd's own shutdown lines (a forced shutdown logs a
	// stack) would otherwise push the failing step out of the tail the result keeps.
	buildLog := log.String()
	stop()
	if err != nil {
		res.Message, res.Log = err.Error(), buildLog
		return res
	}
	res.Digest = digest
	return res
}

// startDaemon starts buildkitd and waits until its socket answers; stop ends it.
func startDaemon(ctx context.Context, o options, work, config string, out io.Writer) (stop func(), err error) {
	cfg := filepath.Join(work, "buildkitd.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return nil, err
	}
	sock := filepath.Join(work, "buildkitd.sock")
	cmd := exec.Command(o.buildkitd, "--config", cfg, "--root", o.stateDir, "--addr", "unix://"+sock) //nolint:gosec // G204: our own binary
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// exited is closed once buildkitd is gone; waitErr is then its exit status.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	if err := waitSocket(ctx, sock, exited, func() error { return waitErr }); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// waitSocket waits for buildkitd's socket with a back-off (10 ms doubling to 500 ms), for at most
// daemonStartTimeout, or until buildkitd exits.
func waitSocket(ctx context.Context, sock string, exited <-chan struct{}, status func() error) error {
	ctx, cancel := context.WithTimeout(ctx, daemonStartTimeout)
	defer cancel()
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			return c.Close()
		}
		select {
		case <-exited:
			return fmt.Errorf("buildkitd exited: %v", status())
		case <-ctx.Done():
			return fmt.Errorf("buildkitd did not answer: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// buildAndPush runs buildctl and returns the pushed digest.
func buildAndPush(ctx context.Context, o options, args []string, work string, out io.Writer) (string, error) {
	meta := filepath.Join(work, "metadata.json")
	argv, err := buildctlArgs(o, args, "unix://"+filepath.Join(work, "buildkitd.sock"), meta)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, o.buildctl, argv...) //nolint:gosec // G204: our own binary
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = os.Environ()
	if o.dockerConfig != "" {
		cmd.Env = append(cmd.Env, "DOCKER_CONFIG="+o.dockerConfig)
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("the build did not finish within %s", o.timeout)
		}
		return "", fmt.Errorf("buildctl: %w", err)
	}
	return readDigest(meta)
}

// buildctlArgs are buildctl's arguments for the build.
func buildctlArgs(o options, args []string, addr, meta string) ([]string, error) {
	argv := []string{"--addr", addr, "build", "--frontend", "dockerfile.v0",
		"--local", "context=" + o.dockerfileDir, "--local", "dockerfile=" + o.dockerfileDir,
		"--progress", "plain", "--metadata-file", meta}
	for _, a := range args {
		argv = append(argv, "--opt", "build-arg:"+a)
	}
	secrets, err := secretFiles(o.secretsDir)
	if err != nil {
		return nil, err
	}
	for _, s := range secrets {
		argv = append(argv, "--secret", "id="+s+",src="+filepath.Join(o.secretsDir, s))
	}
	output := "type=image,name=" + o.image + ",push=true"
	if o.pushInsecure || o.pushSkipVerify {
		output += ",registry.insecure=true"
	}
	return append(argv, "--output", output), nil
}

// secretFiles lists <secret>/<key> under dir, skipping the kubelet's dot entries (..data).
func secretFiles(dir string) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	secrets, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, s := range secrets {
		if !s.IsDir() || strings.HasPrefix(s.Name(), ".") {
			continue
		}
		keys, err := os.ReadDir(filepath.Join(dir, s.Name()))
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			if !strings.HasPrefix(k.Name(), ".") {
				files = append(files, s.Name()+"/"+k.Name())
			}
		}
	}
	return files, nil
}

// readDigest reads the pushed digest from buildctl's metadata file.
func readDigest(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading buildctl's metadata: %w", err)
	}
	var meta struct {
		Digest string `json:"containerimage.digest"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return "", fmt.Errorf("buildctl's metadata: %w", err)
	}
	if !strings.HasPrefix(meta.Digest, "sha256:") {
		return "", errors.New("buildctl's metadata names no pushed digest")
	}
	return meta.Digest, nil
}

// writeDockerConfig writes the credentials buildctl gives buildkitd into <work>/docker/config.json
// and returns that directory (DOCKER_CONFIG): for each endpoint host, the first the worker's keychain
// gives (the Module's pull secret in --docker-config, the service account's pull secrets, the
// credential providers; registry.Flags.Keychain). Anonymous hosts get no entry.
func writeDockerConfig(work string, o options, eps []registry.Endpoint) (string, error) {
	pullSecret := ""
	if o.dockerConfig != "" {
		pullSecret = filepath.Join(o.dockerConfig, "config.json")
	}
	kc, err := o.registry.Keychain(pullSecret)
	if err != nil {
		return "", err
	}
	auths := map[string]authn.AuthConfig{}
	for _, ep := range eps {
		repo, err := name.NewRepository(ep.Host + "/" + ep.Repository)
		if err != nil {
			return "", err
		}
		a, err := kc.Resolve(repo)
		if err != nil {
			return "", fmt.Errorf("credentials for %s: %w", ep, err)
		}
		if a == authn.Anonymous {
			continue
		}
		cfg, err := a.Authorization()
		if err != nil {
			return "", fmt.Errorf("credentials for %s: %w", ep, err)
		}
		key := ep.Host
		if key == name.DefaultRegistry || key == "docker.io" {
			key = dockerHubConfigKey
		}
		if _, ok := auths[key]; !ok {
			auths[key] = *cfg
		}
	}
	data, err := json.Marshal(map[string]any{"auths": auths})
	if err != nil {
		return "", err
	}
	dir := filepath.Join(work, "docker")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600)
}

// dockerHubConfigKey is the key Docker's config gives Docker Hub (BuildKit's auth provider asks it).
const dockerHubConfigKey = "https://index.docker.io/v1/"

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// readFull reads until buf is full or EOF.
func readFull(r io.Reader, buf []byte) (int, error) {
	n, err := io.ReadFull(r, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return n, nil
	}
	return n, err
}
