package install_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/internal/certs"
	"github.com/kmm-project/kmm/test/install"
)

// render builds config/<dir> with bin/kustomize.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	root, kustomize := tools(t)
	objs, err := install.Render(context.Background(), kustomize, filepath.Join(root, "config", dir))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// parsedArgs parses the manager container's arguments of the rendered Deployment as the binary does.
func parsedArgs(t *testing.T, objs []*unstructured.Unstructured) app.Args {
	t.Helper()
	d := install.Find(objs, "Deployment", deploymentName)
	if d == nil {
		t.Fatalf("no Deployment %s", deploymentName)
	}
	raw, err := install.ContainerArgs(d, "manager")
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.ParseArgs(raw)
	if err != nil {
		t.Fatalf("the Deployment's arguments %q do not parse: %v", raw, err)
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("the Deployment's arguments %q: %v", raw, err)
	}
	return a
}

// TestDefaultInstallUsesKmmNames checks that every object is kmm's own (no generic scaffold
// name that could overwrite another operator's object), in kmm-system, and that the Deployment
// runs the webhook with self-managed certificates for the names the install uses.
func TestDefaultInstallUsesKmmNames(t *testing.T) {
	objs := render(t, "default")
	for _, u := range objs {
		if !strings.HasPrefix(u.GetName(), "kmm") && u.GetKind() != "CustomResourceDefinition" {
			t.Errorf("%s %s: not a kmm name", u.GetKind(), u.GetName())
		}
		if u.GetNamespace() != "" && u.GetNamespace() != ns {
			t.Errorf("%s %s in namespace %s, want %s", u.GetKind(), u.GetName(), u.GetNamespace(), ns)
		}
	}
	vwc := install.Find(objs, "ValidatingWebhookConfiguration", webhookName)
	if vwc == nil {
		t.Fatalf("no ValidatingWebhookConfiguration %s", webhookName)
	}
	hooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
	for _, h := range hooks {
		svc, _, _ := unstructured.NestedStringMap(h.(map[string]any), "clientConfig", "service")
		if svc["name"] != serviceName || svc["namespace"] != ns {
			t.Errorf("the webhook calls Service %s/%s, want %s/%s", svc["namespace"], svc["name"], ns, serviceName)
		}
		if policy, _, _ := unstructured.NestedString(h.(map[string]any), "failurePolicy"); policy != "Fail" {
			t.Errorf("failurePolicy %q, want Fail (docs/install.md)", policy)
		}
	}
	if install.Find(objs, "Service", serviceName) == nil || install.Find(objs, "Service", "kmm-metrics-service") == nil {
		t.Error("the webhook or the metrics Service is missing")
	}
	d := install.Find(objs, "Deployment", deploymentName)
	raw, _ := install.ContainerArgs(d, "manager")
	if slices.ContainsFunc(raw, func(a string) bool { return strings.HasPrefix(a, "--disable-webhook") }) {
		t.Error("the Deployment turns the webhook off")
	}
	a := parsedArgs(t, objs)
	want := certs.DefaultOptions()
	if a.CertManagement != certs.ModeSelf || a.Certs.SecretName != secretName || a.Certs.Namespace != ns ||
		a.Certs.WebhookConfigName != webhookName || a.Certs.ServiceName != serviceName {
		t.Errorf("certificate settings %s %+v, want self-managed for %s, %s, %s", a.CertManagement, a.Certs, secretName, webhookName, serviceName)
	}
	if a.Certs.Validity != want.Validity || a.Certs.RefreshBefore != want.RefreshBefore {
		t.Errorf("certificate lifetime %v renewed %v before its end, want the defaults", a.Certs.Validity, a.Certs.RefreshBefore)
	}
	if !a.MetricsSecure || !a.LeaderElect || a.LeaderElectNamespace != ns {
		t.Errorf("metrics secure %v, leader election %v in %q: want secure metrics and leader election in %s", a.MetricsSecure, a.LeaderElect, a.LeaderElectNamespace, ns)
	}
	if a.WorkerImage != "kmm-worker:dev" {
		t.Errorf("worker image %q, want kmm-worker:dev", a.WorkerImage)
	}
	// The Service ports lead to the ports the manager listens on.
	ports := containerPorts(t, d)
	for svc, flagAddr := range map[string]string{serviceName: fmt.Sprint(":", a.WebhookPort), "kmm-metrics-service": a.MetricsAddr} {
		target := servicePorts(t, install.Find(objs, "Service", svc))[0]
		if p, ok := ports[target]; !ok || !strings.HasSuffix(flagAddr, ":"+p) {
			t.Errorf("Service %s targets %q (container port %q), the manager listens on %q", svc, target, p, flagAddr)
		}
	}
}

// TestRBACIsLeastPrivilege checks the rendered roles: no wildcard; Secrets listed, watched and
// created only through the Role in kmm-system (elsewhere only get), written only by name; the webhook configuration and the
// PreflightValidation CRD (its conversion caBundle) written only by name.
func TestRBACIsLeastPrivilege(t *testing.T) {
	objs := render(t, "default")
	for _, u := range objs {
		if u.GetKind() != "ClusterRole" && u.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(u.Object, "rules")
		for i, r := range rules {
			rule := r.(map[string]any)
			where := fmt.Sprintf("%s %s rule %d", u.GetKind(), u.GetName(), i)
			list := func(k string) []string { v, _, _ := unstructured.NestedStringSlice(rule, k); return v }
			for _, k := range []string{"apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"} {
				if slices.Contains(list(k), "*") {
					t.Errorf("%s: a wildcard in %s", where, k)
				}
			}
			writes := slices.ContainsFunc(list("verbs"), func(v string) bool { return v == "update" || v == "patch" || v == "delete" })
			if slices.Contains(list("resources"), "secrets") {
				// Outside kmm-system only get: the PreflightValidation controller reads each
				// Module's imageRepoSecret by name; listing or watching every Secret stays out.
				if (u.GetKind() != "Role" || u.GetNamespace() != ns) && !slices.Equal(list("verbs"), []string{"get"}) {
					t.Errorf("%s: Secrets outside a Role in %s with verbs %v, want get only", where, ns, list("verbs"))
				}
				if writes && !slices.Equal(list("resourceNames"), []string{secretName}) {
					t.Errorf("%s: writes Secrets other than %s", where, secretName)
				}
			}
			if slices.Contains(list("resources"), "customresourcedefinitions") && (writes || slices.Contains(list("verbs"), "get")) &&
				!slices.Equal(list("resourceNames"), []string{"preflightvalidations.kmm.sigs.x-k8s.io"}) {
				t.Errorf("%s: reads or writes CRDs other than the PreflightValidation one", where)
			}
			if slices.Contains(list("resources"), "validatingwebhookconfigurations") && (writes || slices.Contains(list("verbs"), "get")) &&
				!slices.Equal(list("resourceNames"), []string{webhookName}) {
				t.Errorf("%s: reads or writes webhook configurations other than %s", where, webhookName)
			}
		}
	}
}

// TestOneImageEditMovesBoth checks that `kustomize edit set image` on the install sets the
// operator's image and the worker image the operator is given.
func TestOneImageEditMovesBoth(t *testing.T) {
	root, kustomize := tools(t)
	ctx := context.Background()
	const manager, worker = "registry.example.com/kmm/kmm-manager:v1.2.3", "registry.example.com/kmm/kmm-worker:v1.2.3"
	dir, err := install.Overlay(ctx, kustomize, filepath.Join(root, "config", "default"), t.TempDir(),
		[]string{"kmm-manager=" + manager, "kmm-worker=" + worker})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Render(ctx, kustomize, dir)
	if err != nil {
		t.Fatal(err)
	}
	d := install.Find(objs, "Deployment", deploymentName)
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if image := containers[0].(map[string]any)["image"]; image != manager {
		t.Errorf("the operator's image is %v, want %s", image, manager)
	}
	if a := parsedArgs(t, objs); a.WorkerImage != worker {
		t.Errorf("the operator runs worker image %q, want %s", a.WorkerImage, worker)
	}
}

// TestCertManagerOverlay checks config/cert-manager: the operator leaves the certificate alone and
// serves cert-manager's Secret, which is issued for the webhook Service, whose CA is injected.
func TestCertManagerOverlay(t *testing.T) {
	objs := render(t, "cert-manager")
	a := parsedArgs(t, objs)
	if a.CertManagement != certs.ModeNone {
		t.Errorf("--cert-management=%s, want %s", a.CertManagement, certs.ModeNone)
	}
	cert := install.Find(objs, "Certificate", "kmm-serving-cert")
	if cert == nil {
		t.Fatal("no Certificate kmm-serving-cert")
	}
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if !slices.Contains(dnsNames, serviceDNS) {
		t.Errorf("the Certificate is for %v, not %s", dnsNames, serviceDNS)
	}
	certSecret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	volumes, _, _ := unstructured.NestedSlice(install.Find(objs, "Deployment", deploymentName).Object, "spec", "template", "spec", "volumes")
	var mounted string
	for _, v := range volumes {
		vm := v.(map[string]any)
		if vm["name"] == "serving-certs" {
			if _, ok := vm["emptyDir"]; ok {
				t.Error("the certificate volume is still an emptyDir")
			}
			mounted, _, _ = unstructured.NestedString(vm, "secret", "secretName")
		}
	}
	if mounted == "" || mounted != certSecret {
		t.Errorf("the operator mounts Secret %q, cert-manager writes %q", mounted, certSecret)
	}
	vwc := install.Find(objs, "ValidatingWebhookConfiguration", webhookName)
	if got := vwc.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != ns+"/"+cert.GetName() {
		t.Errorf("inject-ca-from %q, want %s/%s", got, ns, cert.GetName())
	}
}

// TestPrometheusMonitorScrapesTheMetricsService checks that the ServiceMonitor selects the
// metrics Service and scrapes its port over HTTPS with the Prometheus token.
func TestPrometheusMonitorScrapesTheMetricsService(t *testing.T) {
	monitor := install.Find(render(t, "prometheus"), "ServiceMonitor", "kmm-controller-manager-metrics")
	if monitor == nil {
		t.Fatal("no ServiceMonitor")
	}
	svc := install.Find(render(t, "default"), "Service", "kmm-metrics-service")
	selector, _, _ := unstructured.NestedStringMap(monitor.Object, "spec", "selector", "matchLabels")
	for k, v := range selector {
		if svc.GetLabels()[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s, the metrics Service has %q", k, v, svc.GetLabels()[k])
		}
	}
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	ep := endpoints[0].(map[string]any)
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if ep["port"] != ports[0].(map[string]any)["name"] || ep["scheme"] != "https" || ep["bearerTokenFile"] == nil {
		t.Errorf("the ServiceMonitor endpoint %v does not scrape the Service's port %v over HTTPS with a token", ep, ports[0])
	}
}

func TestContainerArgsExpandsEnvLikeTheKubelet(t *testing.T) {
	d := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{
			"name": "manager",
			"args": []any{"--a=$(A)", "--b=$$(A)", "--c=$(UNSET)", "--d=$(A)$(B)x", "--e=$", "--f=$(A"},
			"env":  []any{map[string]any{"name": "A", "value": "1"}, map[string]any{"name": "B", "value": "2"}},
		}},
	}}}}}
	got, err := install.ContainerArgs(d, "manager")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--a=1", "--b=$(A)", "--c=$(UNSET)", "--d=12x", "--e=$", "--f=$(A"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func containerPorts(t *testing.T, d *unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	ports, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "ports")
	for _, p := range ports {
		pm := p.(map[string]any)
		out[fmt.Sprint(pm["name"])] = fmt.Sprint(pm["containerPort"])
	}
	return out
}

func servicePorts(t *testing.T, svc *unstructured.Unstructured) []string {
	t.Helper()
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	out := make([]string, 0, len(ports))
	for _, p := range ports {
		out = append(out, fmt.Sprint(p.(map[string]any)["targetPort"]))
	}
	return out
}
