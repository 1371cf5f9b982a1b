package takeover_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/poll"
)

// upstreamNMC is an NMC as upstream KMM leaves it on a node where it loaded a Module.
func upstreamNMC() *unstructured.Unstructured {
	config := map[string]any{
		"kernelVersion": "6.1.0-13-amd64", "containerImage": "reg.example.com/nic:6.1", "imagePullPolicy": "IfNotPresent",
		"insecurePull": true, "inTreeModuleToRemove": "nic_old",
		"modprobe": map[string]any{"moduleName": "nic", "dirName": "/opt"},
	}
	identity := func() map[string]any {
		return map[string]any{"name": "nic", "namespace": "drivers", "serviceAccountName": "nic-sa", "version": "v1",
			"tolerations": []any{map[string]any{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}}}
	}
	spec, status := identity(), identity()
	spec["config"] = config
	status["config"] = config
	status["bootId"] = "8d5a3d7c-0f8e-4b0e-9f52-2f1c3c6a1b11"
	status["lastTransitionTime"] = "2026-11-01T10:00:00Z"
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(), "kind": "NodeModulesConfig",
		"metadata": map[string]any{"name": "node-1"},
		"spec":     map[string]any{"modules": []any{spec}},
		"status":   map[string]any{"modules": []any{status}},
	}}
}

// TestCRDSwitchKeepsUpstreamFields stores an NMC under upstream KMM's CRD shape, installs kmm's CRD
// over it (as an administrator switching does) and reads upstream's fields back through kmm's
// types: the API server prunes on read whatever the served schema lacks, so every field kmm adopts
// from must be in kmm's schema.
func TestCRDSwitchKeepsUpstreamFields(t *testing.T) {
	cfg, root := startAPIServer(t)
	ctx := context.Background()
	installCRD(t, cfg, filepath.Join("testdata", "upstream-nmc-crd.yaml"))
	c := newClient(t, cfg)
	u := upstreamNMC()
	status := u.Object["status"]
	if err := c.Create(ctx, u, client.FieldOwner("kmm")); err != nil {
		t.Fatal(err)
	}
	u.Object["status"] = status
	if err := c.Status().Update(ctx, u, client.FieldOwner("kmm")); err != nil {
		t.Fatal(err)
	}

	installKMMOverUpstream(t, cfg, root, c)
	got := &kmmv1beta1.NodeModulesConfig{}
	if err := c.Get(ctx, client.ObjectKey{Name: "node-1"}, got); err != nil {
		t.Fatal(err)
	}
	spec, st := got.SpecEntry("drivers", "nic"), got.StatusEntry("drivers", "nic")
	if spec == nil || st == nil || st.Config == nil {
		t.Fatalf("entries lost across the CRD switch: %+v", got)
	}
	want := kmmv1beta1.NodeModuleStatus{
		Namespace: "drivers", Name: "nic", ServiceAccountName: "nic-sa", UpstreamBootID: "8d5a3d7c-0f8e-4b0e-9f52-2f1c3c6a1b11", Version: "v1",
	}
	if st.UpstreamBootID != want.UpstreamBootID || st.Version != want.Version || st.ServiceAccountName != want.ServiceAccountName || st.LastTransitionTime.IsZero() {
		t.Errorf("status entry after the switch: bootId %q version %q serviceAccountName %q lastTransitionTime %v", st.UpstreamBootID, st.Version, st.ServiceAccountName, st.LastTransitionTime)
	}
	for name, cfg := range map[string]*kmmv1beta1.ModuleConfig{"spec": &spec.Config, "status": st.Config} {
		if !cfg.InsecurePull || cfg.InTreeModuleToRemove != "nic_old" || cfg.ImagePullPolicy != corev1.PullIfNotPresent ||
			cfg.KernelVersion != "6.1.0-13-amd64" || cfg.Modprobe.ModuleName != "nic" {
			t.Errorf("%s config after the switch: %+v", name, cfg)
		}
	}
	if spec.Version != "v1" || spec.ServiceAccountName != "nic-sa" || len(spec.Tolerations) != 1 || len(st.Tolerations) != 1 {
		t.Errorf("spec entry after the switch: version %q serviceAccountName %q tolerations %v / %v", spec.Version, spec.ServiceAccountName, spec.Tolerations, st.Tolerations)
	}
}

// startAPIServer starts kube-apiserver and etcd with no CRD installed and returns its config and
// the repository root.
func startAPIServer(t *testing.T) (*rest.Config, string) {
	t.Helper()
	root, err := envtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, err := envtest.StartWith(envtest.Options{Bare: true, StartTimeout: 4 * time.Minute})
	if err != nil {
		t.Fatal(err) // `make test` builds the control plane into bin/ first
	}
	t.Cleanup(func() { _ = env.Stop() })
	return env.Config, root
}

// installCRD installs (or replaces) the CRDs of a file and waits until they are served.
func installCRD(t *testing.T, cfg *rest.Config, path string) {
	t.Helper()
	if _, err := ctrlenvtest.InstallCRDs(cfg, ctrlenvtest.CRDInstallOptions{Paths: []string{path}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("installing %s: %v", path, err)
	}
}

// installKMMOverUpstream installs kmm's NMC CRD over upstream's and waits until the API server
// serves its schema. InstallCRDs waits only until the CRD's versions are in discovery, which they
// already were under upstream's CRD, and the new schema is served a moment later: a clean-clone CI
// run applied an entry too early and was refused on upstream's "insecurePull: Required value", and
// a read as early sees upstream's schema, not the one whose pruning the switch test checks. An
// entry without insecurePull is refused by upstream's schema and accepted by kmm's, so the wait
// ends when a dry run of one is accepted.
func installKMMOverUpstream(t *testing.T, cfg *rest.Config, root string, c client.Client) {
	t.Helper()
	installCRD(t, cfg, filepath.Join(root, "config", "crd", "bases", "kmm.sigs.x-k8s.io_nodemodulesconfigs.yaml"))
	probe := map[string]any{"name": "nic", "namespace": "drivers",
		"config": map[string]any{"kernelVersion": "6.1.0-13-amd64", "containerImage": "reg.example.com/nic:6.1", "modprobe": map[string]any{"moduleName": "nic"}}}
	poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		err := applyModules(context.Background(), c, "schema-probe", []client.PatchOption{client.DryRunAll}, probe)
		return err == nil, fmt.Sprintf("an entry without insecurePull, under kmm's schema: %v", err)
	})
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := kmmv1beta1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
