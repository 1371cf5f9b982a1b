package takeover_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestUpstreamOwnershipBreaksApplyRemoval reproduces the 422 of issue 18 with the managedFields the
// API server itself records for upstream KMM's write (manager "manager", an Update, under upstream's
// schema where spec.modules is a plain list: it owns spec.modules as one field), then kmm's CRD:
// a per-Module server-side apply of the entry succeeds (forced) but leaves upstream's leftovers beside
// the config (the config itself is atomic: replaced whole), and
// applying no entry, the removal, is refused with "spec.modules ... must be of type array" (the list
// would go to null). That is why kmm removes and rewrites the entries of such an NMC with a JSON
// merge patch that replaces spec.modules whole and drops upstream's managedFields
// (controllers/takeover.go, takeOver; controllers/takeover_test.go runs it end to end with this
// ownership): the second half checks that, after such a patch, apply and removal work.
func TestUpstreamOwnershipBreaksApplyRemoval(t *testing.T) {
	cfg, root := startAPIServer(t)
	ctx := context.Background()
	installCRD(t, cfg, filepath.Join("testdata", "upstream-nmc-crd.yaml"))
	c := newClient(t, cfg)
	if err := c.Create(ctx, upstreamNMC(), client.FieldOwner("manager")); err != nil {
		t.Fatal(err)
	}
	installKMMOverUpstream(t, cfg, root, c)

	entry := map[string]any{"name": "nic", "namespace": "drivers", "serviceAccountName": "nic-sa",
		"config": map[string]any{"kernelVersion": "6.1.0-13-amd64", "containerImage": "reg.example.com/nic:6.1", "modprobe": map[string]any{"moduleName": "nic"}}}
	apply := func(modules ...any) error { return applyModules(ctx, c, "node-1", nil, modules...) }
	get := func() *kmmv1beta1.NodeModulesConfig {
		t.Helper()
		got := &kmmv1beta1.NodeModulesConfig{}
		if err := c.Get(ctx, client.ObjectKey{Name: "node-1"}, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if mf := get().ManagedFields; len(mf) != 1 || mf[0].Manager != "manager" || mf[0].FieldsV1.GetRawString() != `{"f:spec":{".":{},"f:modules":{}}}` {
		t.Fatalf("upstream's ownership as recorded: %+v", mf)
	}
	if err := apply(entry); err != nil {
		t.Fatalf("applying kmm's entry over upstream's ownership: %v", err)
	}
	// Upstream's leftovers beside the config stay (no one owns them); the config is atomic, so the
	// apply replaced it whole and upstream's insecurePull went with it.
	if e := get().SpecEntry("drivers", "nic"); e == nil || len(e.Tolerations) == 0 || e.Config.InsecurePull {
		t.Errorf("the apply was expected to leave upstream's tolerations and replace its config: %+v", e)
	}
	err := apply()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("removing the entry by apply: %v, want the 422 the issue reports", err)
	}
	t.Logf("reproduced: %v", err)

	// What kmm's takeover patch does instead: spec.modules whole, upstream's managedFields dropped
	// (one entry of kmm's own kept, so the list is never empty), resourceVersion-guarded.
	nmc := get()
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": nmc.ResourceVersion, "managedFields": []any{map[string]any{
			"manager": "kmm-takeover", "operation": "Update", "apiVersion": kmmv1beta1.GroupVersion.String(), "fieldsType": "FieldsV1",
			"fieldsV1": map[string]any{"f:metadata": map[string]any{"f:annotations": map[string]any{".": map[string]any{}, "f:kmm.sigs.x-k8s.io/taken-over": map[string]any{}}}},
		}}, "annotations": map[string]any{"kmm.sigs.x-k8s.io/taken-over": "true"}},
		"spec": map[string]any{"modules": []any{entry}},
	})
	if err := c.Patch(ctx, nmc, client.RawPatch(types.MergePatchType, patch), client.FieldOwner("kmm-takeover")); err != nil {
		t.Fatalf("the takeover patch: %v", err)
	}
	if err := apply(entry); err != nil {
		t.Fatalf("applying after the takeover patch: %v", err)
	}
	if e := get().SpecEntry("drivers", "nic"); e == nil || len(e.Tolerations) != 0 || e.Config.InsecurePull {
		t.Errorf("upstream's leftovers after the takeover patch: %+v", e)
	}
	if err := apply(); err != nil {
		t.Fatalf("removing the entry by apply after the takeover patch: %v", err)
	}
	if e := get().SpecEntry("drivers", "nic"); e != nil {
		t.Errorf("the entry is still there: %+v", e)
	}
}

// applyModules server-side applies spec.modules of the NMC name as the field manager of kmm's
// Module drivers/nic, forced, with opts (a dry run, say) on top.
func applyModules(ctx context.Context, c client.Client, name string, opts []client.PatchOption, modules ...any) error {
	data, _ := json.Marshal(map[string]any{"apiVersion": kmmv1beta1.GroupVersion.String(), "kind": "NodeModulesConfig",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"modules": append([]any{}, modules...)}})
	obj := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}
	opts = append([]client.PatchOption{client.FieldOwner("kmm-module/drivers/nic"), client.ForceOwnership}, opts...)
	return c.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, data), opts...)
}
