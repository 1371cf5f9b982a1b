package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
)

// build generates the bundle from config/default (bin/kustomize, `make tools`) into a new directory.
func build(t *testing.T) (string, *rendered) {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "bin", "kustomize"), "build", filepath.Join(root, "config", "default")).Output()
	if err != nil {
		t.Fatalf("kustomize build config/default (make tools builds bin/kustomize): %v", err)
	}
	r, err := parse(out)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := generate(bytes.NewReader(out), dir); err != nil {
		t.Fatal(err)
	}
	return dir, r
}

// TestBundleIsValid runs operator-framework's validators on the generated bundle, and checks that
// a bundle missing an owned CRD fails them (the validation is not vacuous).
func TestBundleIsValid(t *testing.T) {
	dir, _ := build(t)
	var out bytes.Buffer
	if err := validate(dir, &out); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	t.Log(out.String())
	if err := os.Remove(filepath.Join(dir, "manifests", "modules.kmm.sigs.x-k8s.io.yaml")); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := validate(dir, &out); err == nil || !strings.Contains(out.String(), "owned CRD") {
		t.Fatalf("a bundle without the Module CRD passed the validators: %v\n%s", err, out.String())
	}
}

// TestBundleMatchesConfig checks what v0.9.1's validators do not: each webhook definition names
// the install strategy's Deployment and a port of its container, and matches config/default's
// webhook (path, rules, selector); the permissions are for the Deployment's ServiceAccount; OLM
// provides the certificate (--cert-management=none, where OLM mounts it); the install mode is
// AllNamespaces only.
func TestBundleMatchesConfig(t *testing.T) {
	dir, r := build(t)
	b, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var strategy v1alpha1.StrategyDetailsDeployment = b.CSV.Spec.InstallStrategy.StrategySpec
	if len(strategy.DeploymentSpecs) != 1 {
		t.Fatalf("%d deployments", len(strategy.DeploymentSpecs))
	}
	dep := strategy.DeploymentSpecs[0]
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	var ports []int32
	for _, p := range c.Ports {
		ports = append(ports, p.ContainerPort)
	}
	byName := map[string]v1alpha1.WebhookDescription{}
	for _, w := range b.CSV.Spec.WebhookDefinitions {
		byName[w.GenerateName] = w
		if w.DeploymentName != dep.Name || !slices.Contains(ports, w.ContainerPort) {
			t.Errorf("webhook %s: deployment %s port %d; the strategy has %s with ports %v", w.GenerateName, w.DeploymentName, w.ContainerPort, dep.Name, ports)
		}
	}
	for _, w := range r.webhooks {
		got, ok := byName[w.Name]
		if !ok || got.WebhookPath == nil || *got.WebhookPath != *w.ClientConfig.Service.Path || len(got.Rules) != len(w.Rules) ||
			(w.ObjectSelector == nil) != (got.ObjectSelector == nil) {
			t.Errorf("webhook %s of config/default: the CSV has %+v", w.Name, got)
		}
	}
	if _, ok := byName["cpreflightvalidations.kmm.sigs.x-k8s.io"]; !ok {
		t.Error("no conversion webhook for PreflightValidation")
	}
	for _, p := range append(slices.Clone(strategy.Permissions), strategy.ClusterPermissions...) {
		if p.ServiceAccountName != pod.ServiceAccountName {
			t.Errorf("permissions for %s, the Deployment runs as %s", p.ServiceAccountName, pod.ServiceAccountName)
		}
	}
	var certMode string
	for _, e := range c.Env {
		if e.Name == "KMM_CERT_MANAGEMENT" {
			certMode = e.Value
		}
	}
	if certMode != "none" || !slices.Contains(c.Args, "--webhook-cert-dir="+olmCertDir) || len(pod.Volumes) != 0 {
		t.Errorf("certificate mode %q, args %v, volumes %v: want none, OLM's directory, no volume of its own", certMode, c.Args, pod.Volumes)
	}
	for _, m := range b.CSV.Spec.InstallModes {
		if m.Supported != (m.Type == v1alpha1.InstallModeTypeAllNamespaces) {
			t.Errorf("install mode %s supported: %v", m.Type, m.Supported)
		}
	}
}

// TestBundleIsFresh checks that bundle/ is what make bundle generates now.
func TestBundleIsFresh(t *testing.T) {
	dir, _ := build(t)
	for _, sub := range []string{"manifests", "metadata"} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			want, _ := os.ReadFile(filepath.Join(dir, sub, e.Name()))
			got, err := os.ReadFile(filepath.Join("..", "..", "bundle", sub, e.Name()))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("bundle/%s/%s is stale or missing (%v): run make bundle", sub, e.Name(), err)
			}
		}
	}
}
