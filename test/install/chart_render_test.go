package install_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kmm-project/kmm/test/install"
)

// The one annotation the chart adds to what config/ renders: helm uninstall keeps the
// PreflightValidation CRD, a template (crds/ is never deleted by helm).
const keepPolicy = "helm.sh/resource-policy"

func loadChart(t *testing.T) (*chart.Chart, string) {
	t.Helper()
	root, _ := tools(t)
	dir := filepath.Join(root, install.ChartDir)
	ch, err := install.LoadChart(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ch, dir
}

func renderChart(t *testing.T, ch *chart.Chart, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := install.RenderChart(context.Background(), ch, "kmm", ns, values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestChartMatchesKustomize renders the chart and config/ for the same settings and compares
// them object by object: every object of one is in the other with the same content (the chart
// creates no Namespace: `helm install -n kmm-system --create-namespace`; its
// PreflightValidation CRD carries helm.sh/resource-policy: keep).
func TestChartMatchesKustomize(t *testing.T) {
	ch, _ := loadChart(t)
	cases := []struct {
		name   string
		values map[string]any
		config func(t *testing.T) []*unstructured.Unstructured
	}{
		{"defaults, config/default", nil, func(t *testing.T) []*unstructured.Unstructured { return render(t, "default") }},
		{"certManager.enabled, config/cert-manager", map[string]any{"certManager": map[string]any{"enabled": true}},
			func(t *testing.T) []*unstructured.Unstructured { return render(t, "cert-manager") }},
		{"metrics.serviceMonitor and prometheusRule, config/default with config/prometheus",
			map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}}},
			func(t *testing.T) []*unstructured.Unstructured {
				return append(render(t, "default"), render(t, "prometheus")...)
			}},
		{"controller.secretsClusterWide false, config/components/namespaced-secrets",
			map[string]any{"controller": map[string]any{"secretsClusterWide": false}},
			func(t *testing.T) []*unstructured.Unstructured {
				return renderWithComponents(t, "default", namespacedSecrets)
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fromChart := renderChart(t, ch, c.values)
			fromConfig := c.config(t)
			compareObjects(t, fromChart, fromConfig)
		})
	}
}

func key(u *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
}

func compareObjects(t *testing.T, fromChart, fromConfig []*unstructured.Unstructured) {
	t.Helper()
	byKey := map[string]*unstructured.Unstructured{}
	for _, u := range fromChart {
		if _, dup := byKey[key(u)]; dup {
			t.Errorf("the chart renders %s twice", key(u))
		}
		c := u.DeepCopy()
		if a := c.GetAnnotations(); a[keepPolicy] != "" {
			if c.GetKind() != "CustomResourceDefinition" {
				t.Errorf("%s: %s on an object that is not a CRD", key(u), keepPolicy)
			}
			delete(a, keepPolicy)
			if len(a) == 0 {
				a = nil
			}
			c.SetAnnotations(a)
		}
		byKey[key(u)] = c
	}
	seen := map[string]bool{}
	for _, want := range fromConfig {
		if want.GetKind() == "Namespace" {
			continue
		}
		k := key(want)
		seen[k] = true
		got, ok := byKey[k]
		if !ok {
			t.Errorf("config/ renders %s, the chart does not", k)
			continue
		}
		if d := cmp.Diff(want.Object, got.Object); d != "" {
			t.Errorf("%s differs (-config/ +chart):\n%s", k, d)
		}
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range byKey {
			if !yield(k) {
				return
			}
		}
	}) {
		if !seen[k] {
			t.Errorf("the chart renders %s, config/ does not", k)
		}
	}
	t.Logf("%d objects compared", len(seen))
}

// TestChartWorkerValues sets every worker value and controller setting of the chart and checks
// that the operator, parsing the rendered Deployment's arguments as the binary does, gets each.
func TestChartWorkerValues(t *testing.T) {
	ch, _ := loadChart(t)
	objs := renderChart(t, ch, map[string]any{"controller": map[string]any{
		"image":       "registry.example.com/kmm-manager:v2",
		"workerImage": "registry.example.com/kmm-worker:v2",
		"replicas":    2,
		"leaderElection": map[string]any{
			"leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "3s",
		},
		"nodeSelector": map[string]any{"node-role.kubernetes.io/control-plane": ""},
		"tolerations":  []any{map[string]any{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}},
		"worker": map[string]any{
			"firmwareHostPath":         "/var/lib/firmware",
			"setFirmwareClassPath":     true,
			"containerdConfigPath":     "/etc/containerd/certs.d",
			"registriesConf":           "/etc/containers/registries.conf",
			"certsDirs":                []any{"/etc/containers/certs.d", "/etc/docker/certs.d"},
			"registryCADirs":           []any{"/etc/pki/ca"},
			"registriesConfigMap":      "kmm-registries",
			"caBundleConfigMap":        "kmm-ca-bundle",
			"credentialProviderConfig": "/etc/kubernetes/credential-provider.yaml",
			"credentialProviderBinDir": "/usr/libexec/kubelet-plugins",
		},
	}})
	a := parsedArgs(t, objs)
	o := a.Options
	r := o.WorkerRegistry
	got := map[string]any{
		"worker image": o.WorkerImage, "lease": o.LeaseDuration.String(), "renew": o.RenewDeadline.String(), "retry": o.RetryPeriod.String(),
		"firmware": o.FirmwareHostPath, "class path": o.SetFirmwareClassPath,
		"containerd": r.ContainerdConfigPath, "registries.conf": r.RegistriesConf, "certs.d": strings.Join(r.CertsDirs, ","),
		"ca dirs": strings.Join(r.CADirs, ","), "registries cm": r.RegistriesConfigMap, "ca cm": r.CABundleConfigMap,
		"provider config": r.CredentialProviderConfig, "provider bin": r.CredentialProviderBinDir,
	}
	want := map[string]any{
		"worker image": "registry.example.com/kmm-worker:v2", "lease": "30s", "renew": "20s", "retry": "3s",
		"firmware": "/var/lib/firmware", "class path": true,
		"containerd": "/etc/containerd/certs.d", "registries.conf": "/etc/containers/registries.conf", "certs.d": "/etc/containers/certs.d,/etc/docker/certs.d",
		"ca dirs": "/etc/pki/ca", "registries cm": "kmm-registries", "ca cm": "kmm-ca-bundle",
		"provider config": "/etc/kubernetes/credential-provider.yaml", "provider bin": "/usr/libexec/kubelet-plugins",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("the operator's options from the chart's values (-want +got):\n%s", d)
	}
	d := install.Find(objs, "Deployment", deploymentName)
	replicas, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas")
	sel, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "spec", "nodeSelector")
	tol, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "tolerations")
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	image := containers[0].(map[string]any)["image"]
	if replicas != 2 || len(sel) != 1 || len(tol) != 1 || image != "registry.example.com/kmm-manager:v2" {
		t.Errorf("Deployment: replicas %d, nodeSelector %v, tolerations %v, image %v", replicas, sel, tol, image)
	}
}

// TestChartLints runs helm's linter (`helm lint`, strict: warnings fail) on the chart with its
// defaults and with every optional part on.
func TestChartLints(t *testing.T) {
	_, dir := loadChart(t)
	for _, values := range []map[string]any{nil, {
		"certManager": map[string]any{"enabled": true},
		"metrics":     map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
		"controller":  map[string]any{"secretsClusterWide": false, "worker": map[string]any{"certsDirs": []any{"/etc/containers/certs.d"}}},
	}} {
		lint := action.NewLint()
		lint.Strict = true
		lint.Namespace = ns
		res := lint.Run([]string{dir}, values)
		for _, m := range res.Messages {
			t.Logf("helm lint: %s", m)
		}
		for _, err := range res.Errors {
			t.Errorf("helm lint (values %v): %v", values, err)
		}
	}
}
