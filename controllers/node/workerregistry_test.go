package node

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/controllers/shared"
)

// TestWorkerPodRegistryConfiguration: the node's registry files are mounted read-only at their
// own paths (from the node, even in a dry-run sandbox), the ConfigMaps optionally, and the worker
// is told where each is.
func TestWorkerPodRegistryConfiguration(t *testing.T) {
	reg := WorkerRegistryOptions{
		ContainerdConfigPath: "/etc/containerd/certs.d", RegistriesConf: "/etc/containers/registries.conf",
		CertsDirs: []string{"/etc/docker/certs.d"}, CADirs: []string{"/etc/pki/registry"},
		RegistriesConfigMap: "kmm-registries", CABundleConfigMap: "kmm-ca-bundle",
		CredentialProviderConfig: "/etc/kubernetes/credential-providers.yaml", CredentialProviderBinDir: "/usr/libexec/kubelet-plugins",
	}
	if err := reg.Validate(); err != nil {
		t.Fatal(err)
	}
	pod, err := WorkerPod("n", WorkerPodOptions{Image: "img", DryRunSandbox: "/var/lib/kmm-sandbox", Registry: reg}, intent("", false))
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	wantArgs := "--containerd-config-path /etc/containerd/certs.d --registries-conf /etc/containers/registries.conf " +
		"--operator-registries-conf /etc/kmm/registries/registries.conf --ca-bundle /etc/kmm/ca-bundle/ca-bundle.crt " +
		"--certs-dir /etc/docker/certs.d --credential-provider-config /etc/kubernetes/credential-providers.yaml " +
		"--credential-provider-bin-dir /usr/libexec/kubelet-plugins"
	if args := strings.Join(c.Args, " "); !strings.Contains(args, wantArgs) {
		t.Errorf("args %q, want them to contain %q", args, wantArgs)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	got := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok || !strings.HasPrefix(m.Name, shared.RegistryVolumePrefix) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s is mounted writable", m.MountPath)
		}
		switch {
		case v.HostPath != nil:
			got[m.MountPath] = "host " + v.HostPath.Path + " " + string(*v.HostPath.Type)
		case v.ConfigMap != nil && v.ConfigMap.Optional != nil && *v.ConfigMap.Optional:
			got[m.MountPath] = "optional configmap " + v.ConfigMap.Name
		default:
			got[m.MountPath] = "other"
		}
	}
	want := map[string]string{
		"/etc/containerd/certs.d":                   "host /etc/containerd/certs.d Directory",
		"/etc/containers/registries.conf":           "host /etc/containers/registries.conf File",
		"/etc/docker/certs.d":                       "host /etc/docker/certs.d Directory",
		"/etc/pki/registry":                         "host /etc/pki/registry Directory",
		"/etc/kubernetes/credential-providers.yaml": "host /etc/kubernetes/credential-providers.yaml File",
		"/usr/libexec/kubelet-plugins":              "host /usr/libexec/kubelet-plugins Directory",
		"/etc/kmm/registries":                       "optional configmap kmm-registries",
		"/etc/kmm/ca-bundle":                        "optional configmap kmm-ca-bundle",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("registry mounts (-want +got):\n%s", diff)
	}
	checkWorkerHardening(t, pod)

	// Nothing configured: nothing mounted, no flag.
	plain, _ := WorkerPod("n", WorkerPodOptions{Image: "img"}, intent("", false))
	for _, v := range plain.Spec.Volumes {
		if strings.HasPrefix(v.Name, shared.RegistryVolumePrefix) {
			t.Errorf("unconfigured: volume %s", v.Name)
		}
	}
	for _, bad := range []WorkerRegistryOptions{{ContainerdConfigPath: "etc/containerd"}, {CertsDirs: []string{"/"}}, {CredentialProviderConfig: "/etc/x.yaml"}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}
