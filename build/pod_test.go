package build

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func request() Request {
	return Request{
		Namespace: "drivers", ModuleName: "nic", PodName: "nic-build-abc", Kernel: "6.1.0-56-cloud-amd64",
		Image: "registry.example.com/nic:6.1.0-56-cloud-amd64", BuilderImage: "registry.example.com/kmm-builder:v1",
		DockerfileConfigMap: "nic-dockerfile",
		Labels:              map[string]string{"app": "kmm-build"},
		Owner:               metav1.OwnerReference{APIVersion: "kmm.sigs.x-k8s.io/v1beta1", Kind: "Module", Name: "nic", UID: "uid-1"},
	}
}

// argPairs reads the container's arguments as flag → values (a repeated flag keeps every value;
// a boolean flag has the value "").
func argPairs(t *testing.T, args []string) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("argument %q is not a flag: %q", a, args)
		}
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			m[a] = append(m[a], args[i+1])
			i++
			continue
		}
		m[a] = append(m[a], "")
	}
	return m
}

func mountAt(c corev1.Container, path string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == path {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func volume(p *corev1.Pod, name string) *corev1.Volume {
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == name {
			return &p.Spec.Volumes[i]
		}
	}
	return nil
}

func TestPod(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Request)
		check func(t *testing.T, p *corev1.Pod, args map[string][]string)
	}{
		{"kmm's four build arguments follow the user's, and win over them", func(r *Request) {
			r.BuildArgs = []kmmv1beta1.BuildArg{{Name: "GIT_REF", Value: "v1.2"}, {Name: "KERNEL_VERSION", Value: "forged"}, {Name: "EMPTY", Value: ""}}
		}, func(t *testing.T, _ *corev1.Pod, args map[string][]string) {
			want := []string{"GIT_REF=v1.2", "EMPTY=", "KERNEL_VERSION=6.1.0-56-cloud-amd64", "KERNEL_FULL_VERSION=6.1.0-56-cloud-amd64",
				"MOD_NAME=nic", "MOD_NAMESPACE=drivers"}
			if got := args[FlagBuildArg]; !slices.Equal(got, want) {
				t.Errorf("build args %q, want %q", got, want)
			}
		}},
		{"the Dockerfile ConfigMap's key dockerfile is the Dockerfile of the context", nil, func(t *testing.T, p *corev1.Pod, args map[string][]string) {
			m := mountAt(p.Spec.Containers[0], DockerfileDir)
			if m == nil || !m.ReadOnly {
				t.Fatalf("no read-only mount at %s: %v", DockerfileDir, p.Spec.Containers[0].VolumeMounts)
			}
			v := volume(p, m.Name)
			if v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "nic-dockerfile" ||
				!slices.Equal(v.ConfigMap.Items, []corev1.KeyToPath{{Key: "dockerfile", Path: "Dockerfile"}}) {
				t.Errorf("Dockerfile volume %+v", v)
			}
			if got := args[FlagDockerfileDir]; !slices.Equal(got, []string{DockerfileDir}) {
				t.Errorf("%s %q", FlagDockerfileDir, got)
			}
			if got := args[FlagImage]; !slices.Equal(got, []string{"registry.example.com/nic:6.1.0-56-cloud-amd64"}) {
				t.Errorf("%s %q", FlagImage, got)
			}
		}},
		{"the pull secret is the build's Docker config", func(r *Request) {
			r.PullSecret = &corev1.LocalObjectReference{Name: "pull"}
		}, func(t *testing.T, p *corev1.Pod, args map[string][]string) {
			m := mountAt(p.Spec.Containers[0], PushSecretDir)
			if m == nil || !m.ReadOnly {
				t.Fatalf("no read-only mount at %s", PushSecretDir)
			}
			v := volume(p, m.Name)
			if v == nil || v.Secret == nil || v.Secret.SecretName != "pull" ||
				!slices.Equal(v.Secret.Items, []corev1.KeyToPath{{Key: ".dockerconfigjson", Path: "config.json"}}) {
				t.Errorf("pull secret volume %+v", v)
			}
			if got := args[FlagDockerConfig]; !slices.Equal(got, []string{PushSecretDir}) {
				t.Errorf("%s %q", FlagDockerConfig, got)
			}
		}},
		{"without a pull secret, no Docker config", nil, func(t *testing.T, p *corev1.Pod, args map[string][]string) {
			if _, ok := args[FlagDockerConfig]; ok || mountAt(p.Spec.Containers[0], PushSecretDir) != nil {
				t.Errorf("a Docker config without a pull secret: %q", p.Spec.Containers[0].Args)
			}
		}},
		{"build secrets at /run/secrets/<name>", func(r *Request) {
			r.Secrets = []corev1.LocalObjectReference{{Name: "git-token"}, {Name: "netrc"}}
		}, func(t *testing.T, p *corev1.Pod, args map[string][]string) {
			for _, s := range []string{"git-token", "netrc"} {
				m := mountAt(p.Spec.Containers[0], SecretsDir+"/"+s)
				if m == nil || !m.ReadOnly {
					t.Fatalf("no read-only mount of %s", s)
				}
				if v := volume(p, m.Name); v == nil || v.Secret == nil || v.Secret.SecretName != s {
					t.Errorf("volume of %s: %+v", s, v)
				}
			}
			if got := args[FlagSecretsDir]; !slices.Equal(got, []string{SecretsDir}) {
				t.Errorf("%s %q", FlagSecretsDir, got)
			}
		}},
		{"each registry TLS setting is its own flag", func(r *Request) {
			r.BaseImageRegistryTLS = kmmv1beta1.TLSOptions{InsecureSkipTLSVerify: true}
			r.PushRegistryTLS = kmmv1beta1.TLSOptions{Insecure: true}
		}, func(t *testing.T, _ *corev1.Pod, args map[string][]string) {
			for flag, want := range map[string]bool{FlagBaseSkipVerify: true, FlagPushInsecure: true, FlagBaseInsecure: false, FlagPushSkipVerify: false} {
				if _, got := args[flag]; got != want {
					t.Errorf("%s given: %t, want %t", flag, got, want)
				}
			}
		}},
		{"secure registries by default", nil, func(t *testing.T, _ *corev1.Pod, args map[string][]string) {
			for _, flag := range []string{FlagBaseInsecure, FlagBaseSkipVerify, FlagPushInsecure, FlagPushSkipVerify} {
				if _, ok := args[flag]; ok {
					t.Errorf("%s given by default", flag)
				}
			}
		}},
		{"one-shot, bounded in time, owned, placed, no API token", func(r *Request) {
			r.NodeSelector = map[string]string{"kubernetes.io/arch": "amd64"}
		}, func(t *testing.T, p *corev1.Pod, args map[string][]string) {
			s := p.Spec
			switch {
			case s.RestartPolicy != corev1.RestartPolicyNever:
				t.Errorf("restart policy %s", s.RestartPolicy)
			case s.ActiveDeadlineSeconds == nil || *s.ActiveDeadlineSeconds != 1800:
				t.Errorf("activeDeadlineSeconds %v, want 1800", s.ActiveDeadlineSeconds)
			case s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken:
				t.Error("the service account token is mounted")
			case s.NodeSelector["kubernetes.io/arch"] != "amd64":
				t.Errorf("node selector %v", s.NodeSelector)
			case len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != "uid-1":
				t.Errorf("owners %v", p.OwnerReferences)
			case p.Name != "nic-build-abc" || p.Namespace != "drivers" || p.Labels["app"] != "kmm-build":
				t.Errorf("meta %s/%s %v", p.Namespace, p.Name, p.Labels)
			case s.Containers[0].Image != "registry.example.com/kmm-builder:v1" || s.Containers[0].Name != ContainerName:
				t.Errorf("container %s %s", s.Containers[0].Name, s.Containers[0].Image)
			case s.Containers[0].TerminationMessagePolicy != corev1.TerminationMessageReadFile:
				t.Errorf("termination message policy %s", s.Containers[0].TerminationMessagePolicy)
			case !slices.Equal(args[FlagTimeout], []string{"29m0s"}):
				t.Errorf("builder timeout %q, want a minute under the deadline", args[FlagTimeout])
			}
		}},
		{"unprivileged: root with CAP_SYS_ADMIN under the runtime's seccomp profile, and the builder told so", nil, func(t *testing.T, p *corev1.Pod, args map[string][]string) {
			sc := p.Spec.Containers[0].SecurityContext
			switch {
			case sc == nil:
				t.Fatal("no security context")
			case sc.Privileged != nil && *sc.Privileged:
				t.Error("the build pod is privileged")
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"SYS_ADMIN"}) || len(sc.Capabilities.Drop) != 0:
				t.Errorf("capabilities %+v, want the runtime's default set and SYS_ADMIN", sc.Capabilities)
			case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Errorf("seccomp %+v, want RuntimeDefault", sc.SeccompProfile)
			case sc.RunAsUser == nil || *sc.RunAsUser != 0:
				t.Errorf("runAsUser %v, want 0", sc.RunAsUser)
			}
			if _, ok := args[FlagUnprivileged]; !ok {
				t.Errorf("%s not given: buildkitd would make cgroups and pivot_root the pod cannot", FlagUnprivileged)
			}
		}},
		{"BuildKit's state and /tmp are emptyDirs", nil, func(t *testing.T, p *corev1.Pod, _ map[string][]string) {
			for _, dir := range []string{StateDir, "/tmp"} {
				m := mountAt(p.Spec.Containers[0], dir)
				if m == nil || volume(p, m.Name) == nil || volume(p, m.Name).EmptyDir == nil {
					t.Errorf("%s is not an emptyDir", dir)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request()
			if tt.edit != nil {
				tt.edit(&r)
			}
			p, err := Pod(r)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, p, argPairs(t, p.Spec.Containers[0].Args))
		})
	}
}

func TestPodRefusesAnIncompleteRequest(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Request)
		want string
	}{
		{"no image", func(r *Request) { r.Image = "" }, "no image"},
		{"no builder image", func(r *Request) { r.BuilderImage = "" }, "no builder image"},
		{"no kernel", func(r *Request) { r.Kernel = "" }, "no kernel"},
		{"no ConfigMap", func(r *Request) { r.DockerfileConfigMap = "" }, "no Dockerfile ConfigMap"},
		{"no pod name", func(r *Request) { r.PodName = "" }, "no pod name"},
		{"no owner", func(r *Request) { r.Owner = metav1.OwnerReference{} }, "no owner"},
		{"a build argument named with =", func(r *Request) { r.BuildArgs = []kmmv1beta1.BuildArg{{Name: "A=B", Value: "x"}} }, `invalid build argument name "A=B"`},
		{"a build argument without a name", func(r *Request) { r.BuildArgs = []kmmv1beta1.BuildArg{{Value: "x"}} }, `invalid build argument name ""`},
		{"a pull secret without a name", func(r *Request) { r.PullSecret = &corev1.LocalObjectReference{} }, "pull secret without a name"},
		{"a build secret without a name", func(r *Request) { r.Secrets = []corev1.LocalObjectReference{{}} }, "build secret without a name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := request()
			tt.edit(&r)
			p, err := Pod(r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Pod = %v, %v; want an error with %q", p != nil, err, tt.want)
			}
		})
	}
}

func TestPodDoesNotShareTheRequestsMaps(t *testing.T) {
	r := request()
	r.NodeSelector = map[string]string{"a": "b"}
	p, err := Pod(r)
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["x"], p.Spec.NodeSelector["x"] = "y", "y"
	if r.Labels["x"] != "" || r.NodeSelector["x"] != "" {
		t.Error("the pod's maps are the request's")
	}
}
