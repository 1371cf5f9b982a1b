package takeover_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/poll"
)

// applyEntry applies one Module's spec entry (image "": none) to an NMC as the Module→NMC
// controller does: a field manager per Module, spec.modules holding only that Module's entry.
func applyEntry(ctx context.Context, c client.Client, nmc, module, image string) error {
	modules := []any{}
	if image != "" {
		modules = append(modules, map[string]any{"namespace": "drivers", "name": module, "config": map[string]any{
			"kernelVersion": "6.1.0-13-amd64", "containerImage": image,
			"modprobe": map[string]any{"moduleName": module, "dirName": "/opt"},
		}})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(), "kind": "NodeModulesConfig",
		"metadata": map[string]any{"name": nmc},
		"spec":     map[string]any{"modules": modules},
	}}
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("kmm-module/drivers/"+module), client.ForceOwnership)
}

// writeStatus replaces the NMC's status with an entry, in the given state, for each spec entry
// named in states: the whole list in one update, as the NMC controller writes it.
func writeStatus(ctx context.Context, c client.Client, name string, states map[string]kmmv1beta1.ModuleState) error {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, nmc); err != nil {
		return err
	}
	nmc.Status.Modules = nil
	for _, e := range nmc.Spec.Modules {
		state, ok := states[e.Name]
		if !ok {
			continue
		}
		config := e.Config
		nmc.Status.Modules = append(nmc.Status.Modules, kmmv1beta1.NodeModuleStatus{Namespace: e.Namespace, Name: e.Name,
			Config: &config, State: state, Reason: "WorkerSucceeded", LastTransitionTime: metav1.Now()})
	}
	return c.Status().Update(ctx, nmc, client.FieldOwner("manager"))
}

// fieldsOf returns the managedFields entries of an NMC as manager → fieldsV1 JSON.
func fieldsOf(ctx context.Context, c client.Client, name string) (map[string]string, *kmmv1beta1.NodeModulesConfig, error) {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, nmc); err != nil {
		return nil, nil, err
	}
	out := map[string]string{}
	for _, mf := range nmc.ManagedFields {
		if mf.FieldsV1 != nil {
			out[mf.Manager] = mf.FieldsV1.GetRawString()
		}
	}
	return out, nmc, nil
}

// compactFields says why an NMC's managedFields are not the compact ones of the atomic schema:
// each Module's apply owns its config whole, the NMC controller owns the status list whole.
func compactFields(fields map[string]string) error {
	for manager, f := range fields {
		if strings.HasPrefix(manager, "kmm-module/") && (strings.Contains(f, "f:kernelVersion") || !strings.Contains(f, `"f:config":{}`)) {
			return fmt.Errorf("%s owns the config field by field: %s", manager, f)
		}
		if manager == "manager" && strings.Contains(f, "k:") {
			return fmt.Errorf("the status writer owns status entries key by key: %s", f)
		}
	}
	return nil
}

// TestNMCSchemaUpgradeToAtomicConfigAndStatus upgrades kmm's NMC CRD of c1b73a6 (status.modules a
// list-map, configs owned field by field) to the current one, with an NMC stored under the old
// schema: the Module→NMC applies and the NMC controller's status writes keep working on it (a
// Module's entry changes and goes, another's stays), and an NMC written under the new schema has
// the compact managedFields that make it about a fifth smaller (docs/performance.md).
func TestNMCSchemaUpgradeToAtomicConfigAndStatus(t *testing.T) {
	cfg, root := startAPIServer(t)
	ctx := context.Background()
	c := newClient(t, cfg)
	installCRD(t, cfg, filepath.Join("testdata", "kmm-nmc-crd-c1b73a6.yaml"))
	for _, m := range []string{"nic", "gpu"} {
		if err := applyEntry(ctx, c, "node-old", m, "reg.example.com/"+m+":v1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeStatus(ctx, c, "node-old", map[string]kmmv1beta1.ModuleState{"nic": kmmv1beta1.StateLoaded, "gpu": kmmv1beta1.StateLoaded}); err != nil {
		t.Fatal(err)
	}
	if fields, _, err := fieldsOf(ctx, c, "node-old"); err != nil || compactFields(fields) == nil {
		t.Fatalf("the old schema should own fields one by one (err %v): %v", err, fields)
	}

	installCRD(t, cfg, filepath.Join(root, "config", "crd", "bases", "kmm.sigs.x-k8s.io_nodemodulesconfigs.yaml"))
	// The API server serves the new schema shortly after the CRD is updated: wait for an NMC
	// written under it to be compact.
	i := 0
	poll.Until(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		name := fmt.Sprintf("node-new-%d", i)
		i++
		err := applyEntry(ctx, c, name, "nic", "reg.example.com/nic:v1")
		if err == nil {
			err = writeStatus(ctx, c, name, map[string]kmmv1beta1.ModuleState{"nic": kmmv1beta1.StateLoaded})
		}
		if err != nil {
			t.Fatal(err)
		}
		fresh, _, err := fieldsOf(ctx, c, name)
		if err != nil {
			t.Fatal(err)
		}
		why := compactFields(fresh)
		return why == nil, fmt.Sprintf("an NMC written under the new schema: %v", why)
	})

	// The NMC of the old schema: a config changes, a Module's entry goes, status follows.
	if err := applyEntry(ctx, c, "node-old", "nic", "reg.example.com/nic:v2"); err != nil {
		t.Fatalf("changing a config on an NMC of the old schema: %v", err)
	}
	if err := applyEntry(ctx, c, "node-old", "gpu", ""); err != nil {
		t.Fatalf("removing an entry from an NMC of the old schema: %v", err)
	}
	if err := writeStatus(ctx, c, "node-old", map[string]kmmv1beta1.ModuleState{"nic": kmmv1beta1.StateLoading}); err != nil {
		t.Fatalf("a status write on an NMC of the old schema: %v", err)
	}
	_, got, err := fieldsOf(ctx, c, "node-old")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Modules) != 1 || got.Spec.Modules[0].Name != "nic" || got.Spec.Modules[0].Config.ContainerImage != "reg.example.com/nic:v2" {
		t.Errorf("spec after the upgrade: %+v", got.Spec.Modules)
	}
	if len(got.Status.Modules) != 1 || got.Status.Modules[0].Name != "nic" || got.Status.Modules[0].State != kmmv1beta1.StateLoading {
		t.Errorf("status after the upgrade: %+v", got.Status.Modules)
	}
}
