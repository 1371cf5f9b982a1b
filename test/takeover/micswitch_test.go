package takeover_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/poll"
)

// readSchema reads the v1beta1 schema of a CRD file.
func readSchema(t *testing.T, path string) *apiextensionsv1.JSONSchemaProps {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1beta1" && v.Schema != nil {
			return v.Schema.OpenAPIV3Schema
		}
	}
	t.Fatalf("%s: no v1beta1 schema", path)
	return nil
}

// notCovered lists the fields of upstream's schema that kmm's lacks, holds with another type, or
// requires where upstream does not (an object upstream accepted would be refused on update).
func notCovered(up, kmm *apiextensionsv1.JSONSchemaProps, path string) []string {
	if kmm == nil {
		return []string{path + ": missing"}
	}
	if up.Type != kmm.Type {
		return []string{path + ": type " + up.Type + " in upstream's schema, " + kmm.Type + " in kmm's"}
	}
	var out []string
	for _, r := range kmm.Required {
		if !contains(up.Required, r) {
			out = append(out, path+"."+r+": required by kmm, not by upstream")
		}
	}
	for name, p := range up.Properties {
		var k *apiextensionsv1.JSONSchemaProps
		if kp, ok := kmm.Properties[name]; ok {
			k = &kp
		}
		out = append(out, notCovered(&p, k, path+"."+name)...)
	}
	if up.Items != nil && up.Items.Schema != nil {
		var k *apiextensionsv1.JSONSchemaProps
		if kmm.Items != nil {
			k = kmm.Items.Schema
		}
		out = append(out, notCovered(up.Items.Schema, k, path+"[]")...)
	}
	if up.AdditionalProperties != nil && up.AdditionalProperties.Schema != nil {
		if kmm.AdditionalProperties == nil || kmm.AdditionalProperties.Schema == nil {
			out = append(out, path+": a map in upstream's schema, not in kmm's")
		} else {
			out = append(out, notCovered(up.AdditionalProperties.Schema, kmm.AdditionalProperties.Schema, path+"{}")...)
		}
	}
	sort.Strings(out)
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestMICSchemaIsASupersetOfUpstreams walks upstream's MIC schema and finds every field in kmm's
// generated CRD with the same type, required no more than upstream requires it.
func TestMICSchemaIsASupersetOfUpstreams(t *testing.T) {
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	up := readSchema(t, filepath.Join("testdata", "upstream-mic-crd.yaml"))
	kmm := readSchema(t, filepath.Join(root, "config", "crd", "bases", "kmm.sigs.x-k8s.io_moduleimagesconfigs.yaml"))
	if gaps := notCovered(up, kmm, ""); len(gaps) > 0 {
		t.Fatalf("kmm's MIC schema does not cover upstream's:\n%v", gaps)
	}
	// The walk itself catches a gap (a seeded fault: a field removed from kmm's schema).
	broken := kmm.DeepCopy()
	sign := broken.Properties["spec"].Properties["images"].Items.Schema.Properties["sign"]
	delete(sign.Properties, "filesToSign")
	if gaps := notCovered(up, broken, ""); !reflect.DeepEqual(gaps, []string{".spec.images[].sign.filesToSign: missing"}) {
		t.Fatalf("a removed field is reported as %v", gaps)
	}
}

// upstreamMIC is a MIC as upstream KMM leaves it for a Module that builds and signs.
func upstreamMIC() *unstructured.Unstructured {
	image := map[string]any{
		"image": "reg.example.com/gpu:6.1.0-13-amd64", "kernelVersion": "6.1.0-13-amd64", "skipWaitMissingImage": true, "dirName": "/opt",
		"registryTLS": map[string]any{"insecureSkipTLSVerify": true},
		"build": map[string]any{
			"buildArgs":            []any{map[string]any{"name": "DRIVER", "value": "550"}},
			"dockerfileConfigMap":  map[string]any{"name": "gpu-dockerfile"},
			"baseImageRegistryTLS": map[string]any{"insecure": true},
			"secrets":              []any{map[string]any{"name": "git-token"}},
			"kanikoParams":         map[string]any{"tag": "v1.23"},
			"selector":             map[string]any{"builder": "true"},
		},
		"sign": map[string]any{
			"unsignedImage": "reg.example.com/gpu:unsigned", "unsignedImageRegistryTLS": map[string]any{"insecure": true},
			"keySecret": map[string]any{"name": "sb-key"}, "certSecret": map[string]any{"name": "sb-cert"},
			"filesToSign": []any{"/opt/lib/modules/6.1.0-13-amd64/gpu.ko"},
		},
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(), "kind": "ModuleImagesConfig",
		"metadata": map[string]any{"name": "gpu", "namespace": "default"},
		"spec": map[string]any{"images": []any{image}, "imageRepoSecret": map[string]any{"name": "push"},
			"imagePullPolicy": "Always", "pushBuiltImage": true, "imageRebuildTriggerGeneration": int64(3),
			"tolerations": []any{map[string]any{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}}},
		"status": map[string]any{"imagesStates": []any{map[string]any{"image": "reg.example.com/gpu:6.1.0-13-amd64", "status": "NeedsSigning"}},
			"imageRebuildTriggerGeneration": int64(2)},
	}}
}

// TestMICSwitchKeepsUpstreamFields stores a MIC under upstream's CRD shape, installs kmm's CRD
// over it and reads every field back through kmm's types (the API server prunes on read what the
// served schema lacks).
func TestMICSwitchKeepsUpstreamFields(t *testing.T) {
	cfg, root := startAPIServer(t)
	ctx := context.Background()
	installCRD(t, cfg, filepath.Join("testdata", "upstream-mic-crd.yaml"))
	c := newClient(t, cfg)
	u := upstreamMIC()
	status := u.Object["status"]
	if err := c.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	u.Object["status"] = status
	if err := c.Status().Update(ctx, u); err != nil {
		t.Fatal(err)
	}

	installCRD(t, cfg, filepath.Join(root, "config", "crd", "bases", "kmm.sigs.x-k8s.io_moduleimagesconfigs.yaml"))
	// kmm's schema is served once a status entry without upstream's required "status" is accepted.
	got := &kmmv1beta1.ModuleImagesConfig{}
	poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "gpu"}, got); err != nil {
			return false, err.Error()
		}
		probe := got.DeepCopy()
		probe.Status.ImagesStates = append(probe.Status.ImagesStates, kmmv1beta1.ModuleImageState{Image: "probe:1", State: kmmv1beta1.ImageChecking})
		err := c.Status().Update(ctx, probe, client.DryRunAll)
		return err == nil, "a kmm entry under kmm's schema: " + errString(err)
	})

	img := got.Spec.Images
	want := kmmv1beta1.ModuleImageSpec{
		Image: "reg.example.com/gpu:6.1.0-13-amd64", KernelVersion: "6.1.0-13-amd64", SkipWaitMissingImage: true, DirName: "/opt",
		RegistryTLS: &kmmv1beta1.TLSOptions{InsecureSkipTLSVerify: true},
		Build: &kmmv1beta1.Build{
			BuildArgs: []kmmv1beta1.BuildArg{{Name: "DRIVER", Value: "550"}}, DockerfileConfigMap: &corev1.LocalObjectReference{Name: "gpu-dockerfile"},
			BaseImageRegistryTLS: kmmv1beta1.TLSOptions{Insecure: true}, Secrets: []corev1.LocalObjectReference{{Name: "git-token"}},
			KanikoParams: &kmmv1beta1.KanikoParams{Tag: "v1.23"}, Selector: map[string]string{"builder": "true"},
		},
		Sign: &kmmv1beta1.Sign{
			UnsignedImage: "reg.example.com/gpu:unsigned", UnsignedImageRegistryTLS: kmmv1beta1.TLSOptions{Insecure: true},
			KeySecret: &corev1.LocalObjectReference{Name: "sb-key"}, CertSecret: &corev1.LocalObjectReference{Name: "sb-cert"},
			FilesToSign: []string{"/opt/lib/modules/6.1.0-13-amd64/gpu.ko"},
		},
	}
	if len(img) != 1 || !reflect.DeepEqual(img[0], want) {
		t.Errorf("spec.images after the switch:\n got %+v\nwant %+v", img, want)
	}
	s := got.Spec
	if s.ImageRepoSecret == nil || s.ImageRepoSecret.Name != "push" || s.ImagePullPolicy != corev1.PullAlways || !s.PushBuiltImage ||
		s.ImageRebuildTriggerGeneration == nil || *s.ImageRebuildTriggerGeneration != 3 || len(s.Tolerations) != 1 || s.Tolerations[0].Key != "gpu" {
		t.Errorf("spec after the switch: %+v", s)
	}
	st := got.Status
	if len(st.ImagesStates) != 1 || st.ImagesStates[0].Status != kmmv1beta1.ImageNeedsSigning || st.ImagesStates[0].State != "" ||
		st.ImageRebuildTriggerGeneration == nil || *st.ImageRebuildTriggerGeneration != 2 {
		t.Errorf("status after the switch: %+v", st)
	}
}

func errString(err error) string {
	if err == nil {
		return "accepted"
	}
	return err.Error()
}
