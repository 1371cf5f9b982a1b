package image

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/build"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/image"
)

func recipeModule() *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "gpu", UID: "u1"},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{"gpu": "yes"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "gpu"},
				Sign: &kmmv1beta1.Sign{KeySecret: &corev1.LocalObjectReference{Name: "k"}, CertSecret: &corev1.LocalObjectReference{Name: "c"},
					FilesToSign: []string{"/opt/lib/modules/$KERNEL_FULL_VERSION/gpu.ko"}},
				KernelMappings: []kmmv1beta1.KernelMapping{
					{Literal: "6.1.0-1-amd64", ContainerImage: "reg/gpu:$KERNEL_FULL_VERSION",
						Build: &kmmv1beta1.Build{DockerfileConfigMap: &corev1.LocalObjectReference{Name: "df"}}},
					{Literal: "6.1.0-2-amd64", ContainerImage: "reg/gpu:$KERNEL_FULL_VERSION"},
					{Regexp: "^5", ContainerImage: "reg/gpu:five"},
				},
			}},
		},
	}
}

func kernelNode(name, kernel string, selected bool) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if selected {
		n.Labels["gpu"] = "yes"
	}
	n.Status.NodeInfo.KernelVersion = kernel
	return n
}

// TestDesiredSpec: one entry per image a selected node needs, with the mapping's recipe over the
// container's; unselected nodes, kernels without a mapping and repeats add nothing.
func TestDesiredSpec(t *testing.T) {
	m := recipeModule()
	spec := desiredSpec(m, []corev1.Node{
		kernelNode("a", "6.1.0-1-amd64", true), kernelNode("b", "6.1.0-1-amd64", true),
		kernelNode("c", "6.1.0-2-amd64", true), kernelNode("d", "6.1.0-3-amd64", true),
		kernelNode("e", "5.10.0-1-amd64", false),
	}, []string{"6.1.0-1-amd64"})
	if len(spec.Images) != 2 {
		t.Fatalf("images %+v, want two", spec.Images)
	}
	one, two := spec.Images[0], spec.Images[1]
	if one.Image != "reg/gpu:6.1.0-1-amd64" || one.Build == nil || one.Sign == nil || one.DirName != "/opt" {
		t.Fatalf("first entry %+v, want the 6.1.0-1 image with the mapping's build and the container's sign", one)
	}
	if two.Image != "reg/gpu:6.1.0-2-amd64" || two.Build != nil || two.Sign == nil {
		t.Fatalf("second entry %+v, want the 6.1.0-2 image with the container's sign only", two)
	}
	// A PreflightValidation's kernel with pushBuiltImage: its image too, though no node runs it.
	if spec := desiredSpec(m, nil, []string{"6.1.0-2-amd64"}); len(spec.Images) != 1 || spec.Images[0].Image != "reg/gpu:6.1.0-2-amd64" {
		t.Fatalf("images %+v, want the one of the preflight's kernel", spec.Images)
	}
	m.Spec.ModuleLoader.Container.Sign = nil
	if spec := desiredSpec(m, []corev1.Node{kernelNode("c", "6.1.0-2-amd64", true)}, nil); len(spec.Images) != 0 {
		t.Fatalf("an image without a recipe got an entry: %+v", spec.Images)
	}
}

// TestPods: the build request (unsigned target when signed, kmm's build args) and the sign pod
// (config, Secrets mounted where `worker sign` reads them, no API token, bounded), both with the
// worker pods' registry settings (shared.RegistryOptions.Pod, the one definition).
func TestPods(t *testing.T) {
	m := recipeModule()
	spec := desiredSpec(m, []corev1.Node{kernelNode("a", "6.1.0-1-amd64", true)}, nil)
	mic := &kmmv1beta1.ModuleImagesConfig{Spec: spec}
	e := &spec.Images[0]
	reg := shared.RegistryOptions{ContainerdConfigPath: "/etc/containerd/certs.d", CABundleConfigMap: "ca", RegistriesConfigMap: "conf",
		CredentialProviderConfig: "/etc/kubernetes/cp.yaml", CredentialProviderBinDir: "/usr/libexec/cp"}.Pod([]string{"sa-pull"})
	req := buildRequest(m, mic, e, 3, "builder:1", reg)
	if req.Image != "reg/gpu:6.1.0-1-amd64-drivers_gpu_kmm_unsigned" || req.PodName != PodName("gpu", image.BuildPod, e.Image, 3) {
		t.Fatalf("build request %+v", req)
	}
	pod, err := build.Pod(req)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(pod.Spec.Containers[0].Args, " "); !strings.Contains(args, "KERNEL_FULL_VERSION=6.1.0-1-amd64") || !strings.Contains(args, "MOD_NAMESPACE=drivers") {
		t.Fatalf("build args %s lack kmm's", args)
	}
	sp, err := signPod(m, mic, e, 4, "worker:1", reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{pod, sp} {
		c := p.Spec.Containers[0]
		if !strings.Contains(strings.Join(c.Args, " "), strings.Join(reg.Args, " ")) || !hasAll(c.VolumeMounts, reg.Mounts) || !hasAll(p.Spec.Volumes, reg.Volumes) {
			t.Errorf("pod %s lacks the registry settings %+v: args %q", p.Name, reg, c.Args)
		}
	}
	cfg := sp.Annotations[contract.AnnotationConfig]
	for _, want := range []string{`"unsignedImage":"reg/gpu:6.1.0-1-amd64-drivers_gpu_kmm_unsigned"`, `"image":"reg/gpu:6.1.0-1-amd64"`, `/opt/lib/modules/6.1.0-1-amd64/gpu.ko`} {
		if !strings.Contains(cfg, want) {
			t.Fatalf("sign config %s lacks %s", cfg, want)
		}
	}
	if sp.Labels[LabelImageRun] != "4" || *sp.Spec.AutomountServiceAccountToken || sp.Spec.ActiveDeadlineSeconds == nil || sp.Spec.Containers[0].Args[0] != "sign" {
		t.Fatalf("sign pod %+v", sp)
	}
	if len(sp.Name) > contract.MaxLabelValue {
		t.Fatalf("pod name %q too long", sp.Name)
	}
}

// TestSignPodReadsTheBuildAsItWasPushed: the image a build pushed for the sign is read with the
// registry TLS options the build pushed it with (the mapping's registryTLS), beside the sign's own
// unsignedImageRegistryTLS; a sign without a build reads its unsignedImage with the latter only.
func TestSignPodReadsTheBuildAsItWasPushed(t *testing.T) {
	signConfig := func(m *kmmv1beta1.Module) contract.SignConfig {
		t.Helper()
		spec := desiredSpec(m, []corev1.Node{kernelNode("a", "6.1.0-1-amd64", true)}, nil)
		sp, err := signPod(m, &kmmv1beta1.ModuleImagesConfig{Spec: spec}, &spec.Images[0], 1, "worker:1", shared.RegistryPod{})
		if err != nil {
			t.Fatal(err)
		}
		var cfg contract.SignConfig
		if err := json.Unmarshal([]byte(sp.Annotations[contract.AnnotationConfig]), &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	m := recipeModule()
	m.Spec.ModuleLoader.Container.RegistryTLS = kmmv1beta1.TLSOptions{Insecure: true}
	if cfg := signConfig(m); !cfg.UnsignedImageRegistryTLS.Insecure || !cfg.RegistryTLS.Insecure {
		t.Errorf("build and sign to a plain-HTTP registry: sign config TLS %+v (unsigned) %+v (signed), want both insecure", cfg.UnsignedImageRegistryTLS, cfg.RegistryTLS)
	}
	m.Spec.ModuleLoader.Container.KernelMappings[0].Build = nil
	m.Spec.ModuleLoader.Container.Sign.UnsignedImage = "other/gpu:$KERNEL_FULL_VERSION"
	if cfg := signConfig(m); cfg.UnsignedImageRegistryTLS.Insecure {
		t.Errorf("sign only: the unsigned image is read with %+v, want the sign's own (secure) options", cfg.UnsignedImageRegistryTLS)
	}
}

// hasAll says whether every element of want is in have.
func hasAll[T any](have, want []T) bool {
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h T) bool { return reflect.DeepEqual(h, w) }) {
			return false
		}
	}
	return true
}

// TestFailureMessage: a failed sign pod's message is the worker's reason and message; a build's is
// its log tail, bounded.
func TestFailureMessage(t *testing.T) {
	term := func(msg string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelImageRun: "2"}}, Status: corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "w", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: msg}}}}}}
	}
	f, ok := podFact(term(`{"action":"sign","namespace":"n","name":"m","outcome":"Failed","reason":"SignKey","message":"the key is not the certificate's"}`))
	if !ok || f.Run != 2 || f.Phase != image.PodFailed || f.Message != "SignKey: the key is not the certificate's" {
		t.Fatalf("sign failure %+v", f)
	}
	b, ok := podFact(term(`{"image":"reg.example/kmod:6.1","message":"the build failed: exit code 2","log":"#5 [2/3] RUN make\nError 2"}`))
	if !ok || b.Message != "the build failed: exit code 2\n#5 [2/3] RUN make\nError 2" {
		t.Fatalf("build failure %+v", b)
	}
	long := strings.Repeat("x", 5000) + "Error 2"
	if f, _ := podFact(term(long)); len(f.Message) > maxPodMessage+len("…") || !strings.HasSuffix(f.Message, "Error 2") {
		t.Fatalf("build log tail of %d bytes, want the last %d", len(f.Message), maxPodMessage)
	}
}
