//go:build e2e

package e2e_test

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/test/e2e"
)

// TestBuild runs an in-cluster build on the real node: the pod build.Pod makes (kmm's builder
// image: buildkitd started in the pod, buildctl, runc) builds a real C kmod from a Dockerfile
// ConfigMap against Debian's headers of the qemu test's kernel (the cloud flavour), in a base image
// assembled from Debian packages, and pushes it to the e2e registry; the pushed image holds the .ko
// whose vermagic is the kernel's and whose version carries kmm's build arguments. Until the image
// controller exists the test creates the pod itself (docs/e2e.md).
func TestBuild(t *testing.T) {
	c := cluster(t)
	ctx := context.Background()
	cs := c.Clientset()
	c.WaitNodeReady(t, 2*time.Minute)

	start := time.Now()
	k, err := e2e.FetchKernel(filepath.Join(shared.root, "bin", "e2e-kernel-cache"), e2e.FlavourCloud)
	if err != nil {
		t.Fatal(err)
	}
	builderErr := make(chan error, 1)
	go func() { builderErr <- builderImage(filepath.Join(c.LogDir(), "builder-image.log")) }()
	base, err := e2e.BuildBaseImage(filepath.Join(shared.root, "bin", "e2e-kernel-cache", "build-base-debs"), k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushImage("kmm-e2e/build-base:"+k.Release, base); err != nil {
		t.Fatal(err)
	}
	if err := <-builderErr; err != nil {
		t.Fatal(err)
	}
	builderRef, err := c.PushLayout("kmm/kmm-builder:e2e", filepath.Join(c.Dir, "images", "kmm-builder"))
	if err != nil {
		t.Fatal(err)
	}
	tm.add("build: kernel headers, base image (Debian gcc + headers) and kmm-builder assembled, pushed", start)

	ns := "e2e-build"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cm := createDockerfile(t, c, ns, "kmod-dockerfile", kmodDockerfile(e2e.KmodSourceText()))
	// A Dockerfile whose RUN step fails, built beside: the pod fails and its termination message
	// carries the step's output.
	broken := createDockerfile(t, c, ns, "broken-dockerfile", brokenDockerfile)
	// The registry takes anonymous pushes: the secret shows the mount and DOCKER_CONFIG path work,
	// not that credentials are checked.
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "push-secret"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths":{%q:{"auth":"ZTJlOmUyZQ=="}}}`, c.NodeRegistryAddr())},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	request := func(cm *corev1.ConfigMap, module string) build.Request {
		return build.Request{
			Namespace: ns, ModuleName: module, PodName: module + "-" + strings.ReplaceAll(k.Release, ".", "-"), Kernel: k.Release,
			Image: c.NodeRegistryAddr() + "/kmm-e2e/" + module + ":" + k.Release, BuilderImage: builderRef, DockerfileConfigMap: cm.Name,
			BuildArgs:            []kmmv1beta1.BuildArg{{Name: "BASE", Value: c.NodeRegistryAddr() + "/kmm-e2e/build-base:" + k.Release}},
			PullSecret:           &corev1.LocalObjectReference{Name: "push-secret"},
			BaseImageRegistryTLS: kmmv1beta1.TLSOptions{Insecure: true},
			PushRegistryTLS:      kmmv1beta1.TLSOptions{Insecure: true},
			NodeSelector:         map[string]string{"kubernetes.io/hostname": c.NodeName()},
			Labels:               map[string]string{"app": "kmm-e2e-build"},
			Owner:                metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID},
		}
	}
	start = time.Now()
	pod := createBuildPod(t, c, request(cm, "kmm-build"))
	failing := createBuildPod(t, c, request(broken, "kmm-broken"))
	done := waitPodDone(t, c, ns, pod.Name, 10*time.Minute)
	tm.add("build: build pod created → Succeeded (BuildKit in the pod, kmod compiled, pushed)", start)
	res := buildResult(t, done)
	if done.Status.Phase != corev1.PodSucceeded || !res.Succeeded() {
		t.Fatalf("build pod %s: %s\nmessage: %s\nlog tail:\n%s", done.Name, done.Status.Phase, res.Message, res.Log)
	}
	checkBuiltImage(t, c, k, res)

	failed := waitPodDone(t, c, ns, failing.Name, 5*time.Minute)
	tm.add("build: failing build pod created → Failed, its log tail in the termination message", start)
	fres := buildResult(t, failed)
	switch {
	case failed.Status.Phase != corev1.PodFailed || fres.Succeeded():
		t.Errorf("the failing build: pod %s, result %+v", failed.Status.Phase, fres)
	case !strings.Contains(fres.Log, "kmm-e2e: the step's own output") || !strings.Contains(fres.Log, "did not complete successfully"):
		t.Errorf("the failing build's log tail lacks the step's output or BuildKit's verdict:\n%s", fres.Log)
	default:
		t.Logf("failing build: %s; log tail %d bytes", fres.Message, len(fres.Log))
	}
}

// brokenDockerfile fails in its RUN step after printing a line.
const brokenDockerfile = `ARG BASE
FROM ${BASE}
RUN echo "kmm-e2e: the step's own output" && make -C /nonexistent
`

func createDockerfile(t *testing.T, c *e2e.Cluster, ns, name, dockerfile string) *corev1.ConfigMap {
	t.Helper()
	cm, err := c.Clientset().CoreV1().ConfigMaps(ns).Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{build.DockerfileKey: dockerfile},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// createBuildPod creates the pod build.Pod makes for r, as the image controller will.
func createBuildPod(t *testing.T, c *e2e.Cluster, r build.Request) *corev1.Pod {
	t.Helper()
	pod, err := build.Pod(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clientset().CoreV1().Pods(r.Namespace).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// builderImage builds kmm-builder for this machine's platform into the run's folder.
func builderImage(logFile string) error {
	log, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command("go", "run", "./hack/images", "builder", "--platforms", "linux/"+runtime.GOARCH,
		"--out", filepath.Join(shared.dir, "images"), "--cache", filepath.Join(shared.root, "bin", "images", "cache"))
	cmd.Dir, cmd.Stdout, cmd.Stderr = shared.root, log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("images builder: %w (see %s)", err, logFile)
	}
	return nil
}

// waitPodDone waits until the pod has Succeeded or Failed.
func waitPodDone(t *testing.T, c *e2e.Cluster, ns, podName string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := 200 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		p, err := c.Clientset().CoreV1().Pods(ns).Get(context.Background(), podName, metav1.GetOptions{})
		if err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s/%s not done after %s (last: %v, %v)", ns, podName, timeout, phaseOf(p), err)
		}
		time.Sleep(wait)
	}
}

func phaseOf(p *corev1.Pod) string {
	if p == nil {
		return "no pod"
	}
	return fmt.Sprintf("%s %v", p.Status.Phase, p.Status.ContainerStatuses)
}

// buildResult parses the build container's termination message.
func buildResult(t *testing.T, p *corev1.Pod) build.Result {
	t.Helper()
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == build.ContainerName && s.State.Terminated != nil {
			r, err := build.ParseResult([]byte(s.State.Terminated.Message))
			if err != nil {
				t.Fatalf("build pod %s (%s): %v: %q", p.Name, p.Status.Phase, err, s.State.Terminated.Message)
			}
			return r
		}
	}
	t.Fatalf("build pod %s (%s) has no terminated builder container: %v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
	return build.Result{}
}

// checkBuiltImage pulls the pushed image by the digest the pod reported and checks the module in
// it: built for the kernel (the vermagic of a module Debian built for it, dummy.ko) and with the
// version kmm's build arguments gave it.
func checkBuiltImage(t *testing.T, c *e2e.Cluster, k *e2e.DebianKernel, res build.Result) {
	t.Helper()
	pushed, err := name.ParseReference(res.Image, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(c.RegistryAddr()+"/"+pushed.Context().RepositoryStr()+"@"+res.Digest, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pulling the built image: %v", err)
	}
	files, err := imageFiles(img)
	if err != nil {
		t.Fatal(err)
	}
	ko, ok := files["opt/lib/modules/"+k.Release+"/extra/kmm_e2e.ko"]
	if !ok {
		t.Fatalf("the built image has no opt/lib/modules/%s/extra/kmm_e2e.ko; it has %v", k.Release, keys(files))
	}
	if _, ok := files["opt/lib/modules/"+k.Release+"/modules.dep"]; !ok {
		t.Errorf("the built image has no modules.dep (depmod did not run)")
	}
	got := modinfo(t, ko)
	dummy, err := os.ReadFile(filepath.Join(k.Modules, "kernel", "drivers", "net", "dummy.ko"))
	if err != nil {
		t.Fatal(err)
	}
	want := modinfo(t, dummy)
	if got["vermagic"] == "" || got["vermagic"] != want["vermagic"] {
		t.Errorf("vermagic of the built module %q, of the kernel's own dummy.ko %q", got["vermagic"], want["vermagic"])
	}
	if !strings.HasPrefix(got["vermagic"], k.Release+" ") {
		t.Errorf("vermagic %q does not start with the kernel release %s", got["vermagic"], k.Release)
	}
	if v := got["version"]; v != "e2e-build.kmm-build" {
		t.Errorf("module version %q, want MOD_NAMESPACE.MOD_NAME = e2e-build.kmm-build", v)
	}
	t.Logf("built %s@%s: kmm_e2e.ko %d bytes, vermagic %q, version %q", res.Image, res.Digest, len(ko), got["vermagic"], got["version"])
}

// imageFiles reads the regular files of the image's flattened file system.
func imageFiles(img v1.Image) (map[string][]byte, error) {
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if hdr.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(io.LimitReader(tr, 64<<20))
			if err != nil {
				return nil, err
			}
			files[strings.TrimPrefix(hdr.Name, "/")] = data
		}
	}
}

// modinfo reads a kernel module's .modinfo section (key=value strings, NUL-separated).
func modinfo(t *testing.T, ko []byte) map[string]string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		t.Fatalf("module is not ELF: %v", err)
	}
	s := f.Section(".modinfo")
	if s == nil {
		t.Fatal("module has no .modinfo section")
	}
	data, err := s.Data()
	if err != nil {
		t.Fatal(err)
	}
	info := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			info[k] = v
		}
	}
	return info
}

func keys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// kmodDockerfile is the user's Dockerfile: the module's source inline (a heredoc: the ConfigMap
// holds the Dockerfile only), built with kbuild in the base image for KERNEL_FULL_VERSION, its
// version made of kmm's MOD_NAMESPACE and MOD_NAME, depmod run, and copied into a scratch image
// the way kmm's worker reads kmod images.
func kmodDockerfile(source string) string {
	return `ARG BASE
FROM ${BASE} AS builder
ARG KERNEL_FULL_VERSION
ARG MOD_NAME
ARG MOD_NAMESPACE
COPY <<'KMOD_SOURCE' /src/kmm_e2e.c
` + source + `KMOD_SOURCE
RUN printf '%s\n' 'obj-m := kmm_e2e.o' "ccflags-y := -DKMM_NAME='\"kmm_e2e\"' -DKMM_VERSION='\"${MOD_NAMESPACE}.${MOD_NAME}\"'" > /src/Kbuild && \
    make -C /usr/src/linux-headers-${KERNEL_FULL_VERSION} M=/src modules && \
    mkdir -p /opt/lib/modules/${KERNEL_FULL_VERSION}/extra && \
    cp /src/kmm_e2e.ko /opt/lib/modules/${KERNEL_FULL_VERSION}/extra/ && \
    depmod -b /opt ${KERNEL_FULL_VERSION}

FROM scratch
ARG KERNEL_FULL_VERSION
COPY --from=builder /opt/lib/modules/${KERNEL_FULL_VERSION} /opt/lib/modules/${KERNEL_FULL_VERSION}
`
}
