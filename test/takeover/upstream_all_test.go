package takeover_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/poll"
)

// upstreamCRDs are upstream KMM's CRDs at upstream's current versions (testdata).
var upstreamCRDs = []string{
	"upstream-module-crd.yaml", "upstream-nmc-crd.yaml", "upstream-preflightvalidation-crd.yaml",
	"upstream-moduleimagesconfig-crd.yaml", "upstream-modulebuildsignconfig-crd.yaml",
}

// upstreamObjects are one object of each of upstream's kinds, as upstream's operator leaves them.
func upstreamObjects() []*unstructured.Unstructured {
	obj := func(version, kind, ns, name string, fields map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: fields}
		u.SetAPIVersion("kmm.sigs.x-k8s.io/" + version)
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	images := map[string]any{"images": []any{map[string]any{"image": "reg.example.com/nic:6.1", "kernelVersion": "6.1.0-13-amd64"}}}
	return []*unstructured.Unstructured{
		obj("v1beta1", "Module", "drivers", "nic", map[string]any{"spec": map[string]any{
			"selector": map[string]any{"kubernetes.io/os": "linux"},
			"moduleLoader": map[string]any{"container": map[string]any{
				"modprobe":       map[string]any{"moduleName": "nic"},
				"kernelMappings": []any{map[string]any{"literal": "6.1.0-13-amd64", "containerImage": "reg.example.com/nic:6.1"}},
			}},
		}}),
		upstreamNMC(),
		obj("v1beta2", "PreflightValidation", "", "upgrade", map[string]any{"spec": map[string]any{"kernelVersion": "6.1.0-13-amd64", "pushBuiltImage": false}}),
		obj("v1beta1", "ModuleImagesConfig", "drivers", "nic", map[string]any{"spec": images}),
		obj("v1beta1", "ModuleBuildSignConfig", "drivers", "nic", map[string]any{"spec": images}),
	}
}

// TestInstallOverEveryUpstreamCRD starts from a control plane holding all of upstream KMM's CRDs at
// upstream's versions (PreflightValidation stored as v1beta2) with an object of each, installs kmm
// from config/default as docs/migration.md says (server-side apply of everything it renders), and
// takes over: kmm's CRDs are accepted over upstream's (before issue 36 the PreflightValidation CRD
// was refused: storedVersions v1beta2 missing from spec.versions), every object survives, the
// operator verifies upstream's PreflightValidation in the stored version and puts its finalizer on
// the Module, and the ModuleImagesConfig and ModuleBuildSignConfig objects stay as upstream left
// them under upstream's CRDs.
func TestInstallOverEveryUpstreamCRD(t *testing.T) {
	cfg, root := startAPIServer(t)
	ctx := context.Background()
	c := allKindsClient(t, cfg)
	for _, f := range upstreamCRDs {
		installCRD(t, cfg, filepath.Join("testdata", f))
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "drivers"}}); err != nil {
		t.Fatal(err)
	}
	for _, u := range upstreamObjects() {
		status := u.Object["status"]
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("creating upstream's %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if status != nil {
			u.Object["status"] = status
			if err := c.Status().Update(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
	}
	upstreamPFV := &unstructured.Unstructured{}
	upstreamPFV.SetAPIVersion("kmm.sigs.x-k8s.io/v1beta2")
	upstreamPFV.SetKind("PreflightValidation")
	upstreamPFV.SetName("upgrade")
	if err := c.Get(ctx, client.ObjectKeyFromObject(upstreamPFV), upstreamPFV); err != nil {
		t.Fatal(err)
	}
	upstreamPFV.Object["status"] = map[string]any{"modules": []any{map[string]any{"namespace": "drivers", "name": "nic",
		"verificationStatus": "Success", "verificationStage": "Done", "lastTransitionTime": "2026-11-01T10:00:00Z"}}}
	if err := c.Status().Update(ctx, upstreamPFV); err != nil {
		t.Fatal(err)
	}
	if stored := storedVersions(t, c, "preflightvalidations.kmm.sigs.x-k8s.io"); !slices.Equal(stored, []string{"v1beta2"}) {
		t.Fatalf("upstream's PreflightValidation CRD has stored %v, want [v1beta2] (as on a cluster running upstream)", stored)
	}

	// Install kmm from config/default, as an administrator does.
	kustomize, err := install.Kustomize(root)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Render(ctx, kustomize, filepath.Join(root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	if err := install.Apply(ctx, c, objs, false, nil); err != nil {
		t.Fatalf("installing kmm over upstream's CRDs: %v", err)
	}
	for _, name := range []string{"modules", "nodemodulesconfigs", "preflightvalidations"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name + ".kmm.sigs.x-k8s.io"}, crd); err != nil {
			t.Fatal(err)
		}
		if crd.Labels["app.kubernetes.io/name"] != "kmm" {
			t.Errorf("CRD %s is not kmm's after the install: labels %v", crd.Name, crd.Labels)
		}
	}
	// The admission webhook's way through its Service is test/install's subject: here the operator
	// runs in-process without it, so its configuration goes (as it would if kmm's webhook were down
	// with failurePolicy Ignore); the CRDs keep their conversion stanza, and the operator itself
	// reads and writes only the stored version.
	if err := c.Delete(ctx, install.Find(objs, "ValidatingWebhookConfiguration", "kmm-validating-webhook")); err != nil {
		t.Fatal(err)
	}

	// Every object survives, the Module and NMC read through kmm's types.
	m := &kmmv1beta1.Module{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "drivers", Name: "nic"}, m); err != nil || m.Spec.ModuleLoader == nil {
		t.Fatalf("the Module after the install: %v %+v", err, m.Spec)
	}
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := c.Get(ctx, client.ObjectKey{Name: "node-1"}, nmc); err != nil || nmc.StatusEntry("drivers", "nic") == nil || nmc.StatusEntry("drivers", "nic").UpstreamBootID == "" {
		t.Fatalf("the NMC after the install: %v %+v", err, nmc.Status)
	}
	pv := &kmmv1beta2.PreflightValidation{}
	if err := c.Get(ctx, client.ObjectKey{Name: "upgrade"}, pv); err != nil || len(pv.Status.Modules) != 1 || pv.Status.Modules[0].VerificationStatus != kmmv1beta2.VerificationSuccess {
		t.Fatalf("upstream's PreflightValidation after the install: %v %+v", err, pv.Status)
	}
	before := upstreamInternal(t, c)

	// Take over: the operator runs, verifies the PreflightValidation in the stored version.
	startOperator(t, cfg)
	poll.Until(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Name: "upgrade"}, pv); err != nil {
			return false, err.Error()
		}
		if pv.Status.ObservedGeneration != pv.Generation || len(pv.Status.Modules) != 1 || pv.Status.Modules[0].Reason == "" {
			return false, fmt.Sprintf("kmm's verification of upstream's PreflightValidation: %+v", pv.Status)
		}
		return true, ""
	})
	if e := pv.Status.Modules[0]; e.VerificationStatus != kmmv1beta2.VerificationInProgress || e.Reason != kmmv1beta1.PreflightReasonRegistryUnreachable {
		t.Errorf("the Module's entry %+v, want InProgress (RegistryUnreachable: reg.example.com does not answer)", e)
	}
	poll.Until(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "drivers", Name: "nic"}, m); err != nil {
			return false, err.Error()
		}
		return slices.Contains(m.Finalizers, module.Finalizer), fmt.Sprintf("the Module's finalizers %v", m.Finalizers)
	})
	if after := upstreamInternal(t, c); after != before {
		t.Errorf("upstream's ModuleImagesConfig and ModuleBuildSignConfig changed:\nbefore %s\n after %s", before, after)
	}
}

// upstreamInternal reads upstream's ModuleImagesConfig and ModuleBuildSignConfig objects (which kmm
// does not serve) as a string that changes when either does.
func upstreamInternal(t *testing.T, c client.Client) string {
	t.Helper()
	out := ""
	for _, kind := range []string{"ModuleImagesConfig", "ModuleBuildSignConfig"} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("kmm.sigs.x-k8s.io/v1beta1")
		u.SetKind(kind)
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: "drivers", Name: "nic"}, u); err != nil {
			t.Fatalf("upstream's %s: %v", kind, err)
		}
		out += fmt.Sprintf("%s rv=%s spec=%v; ", kind, u.GetResourceVersion(), u.Object["spec"])
	}
	return out
}

// storedVersions returns status.storedVersions of a CRD.
func storedVersions(t *testing.T, c client.Client, name string) []string {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, crd); err != nil {
		t.Fatal(err)
	}
	return crd.Status.StoredVersions
}

// allKindsClient reaches cfg with the Kubernetes kinds, CRDs and kmm's kinds.
func allKindsClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	s := install.Scheme(nil)
	utilruntime.Must(kmmv1beta1.AddToScheme(s))
	utilruntime.Must(kmmv1beta2.AddToScheme(s))
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startOperator runs kmm's operator in-process (no webhook) until the test ends.
func startOperator(t *testing.T, cfg *rest.Config) {
	t.Helper()
	opts := app.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr = "0", "0"
	opts.DisableWebhook = true
	opts.PreflightCheckTimeout = 2 * time.Second
	mgr, err := app.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the operator: %v", err)
		}
	})
}
