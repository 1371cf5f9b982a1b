package build

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestPod: kmm's four build arguments come first and the user's after them; the Dockerfile
// ConfigMap and the pull secret are mounted; the pod is bounded and never restarted.
func TestPod(t *testing.T) {
	r := Request{Namespace: "ns", ModuleName: "m", PodName: "m-build-1", Kernel: "6.1.0-1-amd64", Image: "reg/m:1",
		BuilderImage: "builder:1", DockerfileConfigMap: "df", BuildArgs: []kmmv1beta1.BuildArg{{Name: "X", Value: "y"}},
		PullSecret: &corev1.LocalObjectReference{Name: "pull"}}
	p, err := Pod(r)
	if err != nil {
		t.Fatal(err)
	}
	args := p.Spec.Containers[0].Args
	for _, want := range []string{"KERNEL_VERSION=6.1.0-1-amd64", "KERNEL_FULL_VERSION=6.1.0-1-amd64", "MOD_NAME=m", "MOD_NAMESPACE=ns", "X=y"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if slices.Index(args, "X=y") < slices.Index(args, "MOD_NAMESPACE=ns") {
		t.Errorf("the user's argument comes before kmm's: %v", args)
	}
	if p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Spec.ActiveDeadlineSeconds == nil || len(p.Spec.Volumes) != 2 {
		t.Fatalf("pod spec %+v", p.Spec)
	}
	r.DockerfileConfigMap = ""
	if _, err := Pod(r); err == nil {
		t.Fatal("a build without a Dockerfile ConfigMap made a pod")
	}
}
