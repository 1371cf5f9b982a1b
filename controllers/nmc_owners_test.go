package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/testbed"
)

// SPEC §4, invariant 2: each NMC field has one writer — spec entries the Module→NMC controller
// (server-side apply, one field manager per Module, kmm-module/<ns>/<name>, owning that Module's
// entry only), status the NMC controller (updates of the status subresource). The API server
// enforces it through field managers, so it is checked here, on the managedFields of real NMCs,
// rather than in the fsm model.

// moduleManagerPrefix starts the field manager of a Module's NMC entries.
const moduleManagerPrefix = "kmm-module/"

// fieldOwnerViolations returns how nmc's managedFields break invariant 2 (nil when they do not).
// statusManager is the field manager of the NMC controller's status updates.
func fieldOwnerViolations(nmc *kmmv1beta1.NodeModulesConfig, statusManager string) []string {
	var out []string
	for _, mf := range nmc.ManagedFields {
		var fields map[string]json.RawMessage
		if mf.FieldsV1 != nil {
			if err := json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields); err != nil {
				out = append(out, fmt.Sprintf("%s: unreadable managedFields: %v", mf.Manager, err))
				continue
			}
		}
		if spec, ok := fields["f:spec"]; ok {
			out = append(out, specOwnerViolations(mf, spec)...)
		}
		if _, ok := fields["f:status"]; ok && (mf.Manager != statusManager || mf.Subresource != "status") {
			out = append(out, fmt.Sprintf("%s (%s, subresource %q) owns status fields: only the NMC controller's status updates (%s) may",
				mf.Manager, mf.Operation, mf.Subresource, statusManager))
		}
	}
	return out
}

// specOwnerViolations checks one managedFields entry that owns spec fields: it must be a Module's
// server-side apply of the main resource, and own only that Module's entry of spec.modules.
func specOwnerViolations(mf metav1.ManagedFieldsEntry, raw json.RawMessage) []string {
	ns, name, ok := strings.Cut(strings.TrimPrefix(mf.Manager, moduleManagerPrefix), "/")
	if !strings.HasPrefix(mf.Manager, moduleManagerPrefix) || !ok || mf.Operation != metav1.ManagedFieldsOperationApply || mf.Subresource != "" {
		return []string{fmt.Sprintf("%s (%s, subresource %q) owns spec fields: only a Module's server-side apply (%s<ns>/<name>) may",
			mf.Manager, mf.Operation, mf.Subresource, moduleManagerPrefix)}
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(raw, &spec); err != nil {
		return []string{fmt.Sprintf("%s: unreadable spec fields: %v", mf.Manager, err)}
	}
	var out []string
	for field, sub := range spec {
		if field == "." {
			continue
		}
		if field != "f:modules" {
			out = append(out, fmt.Sprintf("%s owns spec field %s: a Module's manager owns only its entry of spec.modules", mf.Manager, field))
			continue
		}
		var entries map[string]json.RawMessage
		if err := json.Unmarshal(sub, &entries); err != nil {
			return append(out, fmt.Sprintf("%s: unreadable spec.modules fields: %v", mf.Manager, err))
		}
		for key := range entries {
			var k struct{ Namespace, Name string }
			if key == "." {
				continue
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(key, "k:")), &k); err != nil || k.Namespace != ns || k.Name != name {
				out = append(out, fmt.Sprintf("%s owns the spec.modules entry %s: a Module's manager owns only its own", mf.Manager, key))
			}
		}
	}
	return out
}

// statusManagerOf returns the field manager that owns nmc's status (fails when there is not exactly one).
func statusManagerOf(t *testing.T, nmc *kmmv1beta1.NodeModulesConfig) string {
	t.Helper()
	var managers []string
	for _, mf := range nmc.ManagedFields {
		if mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), `"f:status"`) && !slices.Contains(managers, mf.Manager) {
			managers = append(managers, mf.Manager)
		}
	}
	if len(managers) != 1 || strings.HasPrefix(managers[0], moduleManagerPrefix) {
		t.Fatalf("NMC %s: status owned by %v, want the NMC controller's manager alone", nmc.Name, managers)
	}
	return managers[0]
}

// TestNMCFieldOwners runs two Modules on two nodes through load, an image edit and a deletion, and
// checks invariant 2 on the managedFields of both NMCs after each; then seeds the faults the check
// exists for (a status field written by a Module's manager, a spec field by the NMC controller's, a
// Module's manager writing another Module's entry) on an NMC no controller touches, and requires
// the check to catch each.
func TestNMCFieldOwners(t *testing.T) {
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	cluster.StartOperator(t)
	ctx := context.Background()
	nic, gpu := tb.Module("nic"), tb.Module("gpu")
	tb.Create(nic)
	tb.Create(gpu)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	tb.WaitLoaded("gpu", "reg.example.com/gpu:a", tb.Nodes...)

	var statusManager string
	checkNMCs := func(step string) {
		t.Helper()
		for _, n := range tb.Nodes {
			nmc := &kmmv1beta1.NodeModulesConfig{}
			if err := k8s.Get(ctx, client.ObjectKey{Name: n}, nmc); err != nil {
				t.Fatal(err)
			}
			if statusManager == "" {
				statusManager = statusManagerOf(t, nmc)
			}
			if v := fieldOwnerViolations(nmc, statusManager); len(v) > 0 {
				t.Errorf("%s: NMC %s breaks invariant 2: %v\nmanagedFields: %s", step, n, v, managedFieldsJSON(nmc))
			}
		}
	}
	checkNMCs("both Modules loaded")

	setImage(t, nic.Namespace, nic.Name, "reg.example.com/nic:a2")
	tb.WaitLoaded("nic", "reg.example.com/nic:a2", tb.Nodes...)
	checkNMCs("nic's image edited and reloaded")

	if err := k8s.Delete(ctx, gpu); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if st := cluster.PairStatus(n, tb.NS, "gpu"); st != nil {
				return false, "gpu still on " + n + ": " + testbed.Describe(st)
			}
		}
		return true, ""
	})
	checkNMCs("gpu deleted and unloaded")

	t.Run("seeded faults", func(t *testing.T) {
		seedFieldOwnerFaults(t, tb, statusManager)
	})
}

// seedFieldOwnerFaults writes, for each fault, an NMC of a node that does not exist (so that no
// controller touches it) first as the controllers do, then as they must not, and requires the check
// to pass and then to catch the fault.
func seedFieldOwnerFaults(t *testing.T, tb *testbed.Bed, statusManager string) {
	ctx := context.Background()
	nicManager, gpuManager := moduleManagerPrefix+tb.NS+"/nic", moduleManagerPrefix+tb.NS+"/gpu"
	faults := []struct {
		name  string
		fault func(w *nmcWriter)
	}{
		{"a Module's field manager writes a status field", func(w *nmcWriter) { w.writeStatus(nicManager, "WrittenBySpecManager") }},
		{"the NMC controller's field manager writes a spec field", func(w *nmcWriter) {
			nmc := w.read()
			nmc.Spec.Modules[0].Config.ContainerImage = "reg.example.com/nic:written-by-the-nmc-controller"
			if err := k8s.Update(ctx, nmc, client.FieldOwner(statusManager)); err != nil {
				t.Fatal(err)
			}
		}},
		{"a Module's field manager writes another Module's entry", func(w *nmcWriter) { w.applySpec(gpuManager, "nic", "reg.example.com/nic:a") }},
	}
	for i, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			w := &nmcWriter{t: t, ns: tb.NS, name: fmt.Sprintf("no-such-node-%s-%d", tb.NS, i)}
			t.Cleanup(func() {
				_ = k8s.Delete(ctx, &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: w.name}})
			})
			w.applySpec(nicManager, "nic", "reg.example.com/nic:a")
			w.writeStatus(statusManager, "SpecSet")
			if v := fieldOwnerViolations(w.read(), statusManager); len(v) > 0 {
				t.Fatalf("the check fails on writes the controllers do: %v", v)
			}
			f.fault(w)
			nmc := w.read()
			v := fieldOwnerViolations(nmc, statusManager)
			if len(v) == 0 {
				t.Fatalf("the check missed it\nmanagedFields: %s", managedFieldsJSON(nmc))
			}
			t.Logf("caught: %v", v)
		})
	}
}

// nmcWriter writes one NMC as a controller would, under a field manager of the test's choosing.
type nmcWriter struct {
	t        *testing.T
	ns, name string
}

func (w *nmcWriter) read() *kmmv1beta1.NodeModulesConfig {
	w.t.Helper()
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: w.name}, nmc); err != nil {
		w.t.Fatal(err)
	}
	return nmc
}

// applySpec server-side applies one spec.modules entry, as the Module→NMC controller does.
func (w *nmcWriter) applySpec(manager, module, image string) {
	w.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(), "kind": "NodeModulesConfig",
		"metadata": map[string]any{"name": w.name},
		"spec": map[string]any{"modules": []any{map[string]any{"namespace": w.ns, "name": module, "config": map[string]any{
			"kernelVersion": testbed.KernelA, "containerImage": image, "modprobe": map[string]any{"moduleName": module}}}}},
	}}
	if err := k8s.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership); err != nil {
		w.t.Fatal(err)
	}
}

// writeStatus updates the status subresource, as the NMC controller does.
func (w *nmcWriter) writeStatus(manager, reason string) {
	w.t.Helper()
	nmc := w.read()
	nmc.Status.Modules = []kmmv1beta1.NodeModuleStatus{{Namespace: w.ns, Name: "nic", State: kmmv1beta1.StateLoading, Reason: reason,
		LastTransitionTime: metav1.Now()}}
	if err := k8s.Status().Update(context.Background(), nmc, client.FieldOwner(manager)); err != nil {
		w.t.Fatal(err)
	}
}

func managedFieldsJSON(nmc *kmmv1beta1.NodeModulesConfig) string {
	out, _ := json.Marshal(nmc.ManagedFields)
	return string(out)
}
