package install_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kmm-project/kmm/internal/certs"
	"github.com/kmm-project/kmm/test/install"
)

const (
	operatorSA          = "kmm-controller-manager"
	monitorName         = "kmm-controller-manager-metrics"
	metricsServiceName  = "kmm-metrics-service"
	namespacedSecrets   = "components/namespaced-secrets"
	secretReaderRole    = "kmm-secret-reader"
	secretReaderBinding = "kmm-secret-reader-rolebinding"
	sampleRoleBinding   = "config/samples/secret-reader-rolebinding.yaml"
)

// grant is one verb on one resource that the operator's ServiceAccount holds, in scope: "cluster"
// (a ClusterRoleBinding) or the namespace of a RoleBinding. name is the one resourceName it is
// limited to, "" for any.
type grant struct {
	group, resource, verb, name, scope string
}

func (g grant) String() string {
	group := g.group
	if group == "" {
		group = "core"
	}
	name := g.name
	if name == "" {
		name = "any"
	}
	return fmt.Sprintf("%s %s %s (names: %s) in %s", group, g.resource, g.verb, name, g.scope)
}

// operatorGrants expands every rule bound to the operator's ServiceAccount in objs into grants.
func operatorGrants(t *testing.T, objs []*unstructured.Unstructured) map[grant]bool {
	t.Helper()
	out := map[grant]bool{}
	for _, b := range objs {
		if b.GetKind() != "ClusterRoleBinding" && b.GetKind() != "RoleBinding" {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		bound := false
		for _, s := range subjects {
			sm := s.(map[string]any)
			if sm["kind"] == "ServiceAccount" && sm["name"] == operatorSA && sm["namespace"] == ns {
				bound = true
			}
		}
		if !bound {
			continue
		}
		kind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		roleName, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		scope := "cluster"
		var role *unstructured.Unstructured
		for _, u := range objs {
			if u.GetKind() == kind && u.GetName() == roleName && (kind == "ClusterRole" || u.GetNamespace() == b.GetNamespace()) {
				role = u
			}
		}
		if b.GetKind() == "RoleBinding" {
			scope = b.GetNamespace()
		}
		if role == nil {
			t.Errorf("%s %s binds %s %s, which the install does not hold", b.GetKind(), b.GetName(), kind, roleName)
			continue
		}
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		for _, r := range rules {
			rule := r.(map[string]any)
			list := func(k string) []string { v, _, _ := unstructured.NestedStringSlice(rule, k); return v }
			if len(list("nonResourceURLs")) > 0 {
				t.Errorf("%s %s: the operator holds non-resource URLs %v", kind, roleName, list("nonResourceURLs"))
				continue
			}
			names := list("resourceNames")
			if len(names) == 0 {
				names = []string{""}
			}
			for _, g := range list("apiGroups") {
				for _, res := range list("resources") {
					for _, v := range list("verbs") {
						for _, n := range names {
							out[grant{g, res, v, n, scope}] = true
						}
					}
				}
			}
		}
	}
	return out
}

// renderWithComponents builds base with the given components (directories under config/).
func renderWithComponents(t *testing.T, base string, components ...string) []*unstructured.Unstructured {
	t.Helper()
	root, kustomize := tools(t)
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, "config", p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel(base) + "\ncomponents:\n"
	for _, c := range components {
		k += "  - " + rel(c) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := install.Render(context.Background(), kustomize, dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestSecretAccessIsScoped checks what the install lets the operator do with Secrets. config/default:
// get in every namespace (the PreflightValidation controller reads each Module's imageRepoSecret),
// through kmm-secret-reader alone; list, watch, create and the writes only in kmm-system. With
// the namespaced-secrets component: no Secret outside kmm-system at all, and the operator runs with
// --secrets-cluster-wide=false; the sample RoleBinding grants kmm-secret-reader in a namespace.
func TestSecretAccessIsScoped(t *testing.T) {
	def := operatorGrants(t, render(t, "default"))
	if !def[grant{"", "secrets", "get", "", "cluster"}] {
		t.Error("config/default: the operator cannot get Secrets in the Modules' namespaces")
	}
	for _, objs := range [][]*unstructured.Unstructured{render(t, "default"), renderWithComponents(t, "default", namespacedSecrets)} {
		for _, u := range objs {
			if u.GetKind() != "ClusterRole" || u.GetName() == secretReaderRole {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(u.Object, "rules")
			for _, r := range rules {
				res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
				if slices.Contains(res, "secrets") {
					t.Errorf("ClusterRole %s grants Secrets: only %s may (so that one binding turns it off)", u.GetName(), secretReaderRole)
				}
			}
		}
	}
	namespaced := renderWithComponents(t, "default", namespacedSecrets)
	scoped := operatorGrants(t, namespaced)
	for name, grants := range map[string]map[grant]bool{"config/default": def, "config/default with " + namespacedSecrets: scoped} {
		for g := range grants {
			if g.resource != "secrets" {
				continue
			}
			if g.scope != ns && g.verb != "get" {
				t.Errorf("%s: the operator may %s", name, g)
			}
		}
	}
	for g := range scoped {
		if g.resource == "secrets" && g.scope != ns {
			t.Errorf("with %s the operator still may %s", namespacedSecrets, g)
		}
	}
	if a := parsedArgs(t, namespaced); a.SecretsClusterWide {
		t.Errorf("with %s the operator runs with --secrets-cluster-wide=true", namespacedSecrets)
	}
	if a := parsedArgs(t, render(t, "default")); !a.SecretsClusterWide {
		t.Error("config/default runs the operator with --secrets-cluster-wide=false but grants the cluster-wide get")
	}
	// The component composes with the cert-manager overlay.
	if g := operatorGrants(t, renderWithComponents(t, "cert-manager", namespacedSecrets)); g[grant{"", "secrets", "get", "", "cluster"}] {
		t.Errorf("config/cert-manager with %s still grants get on Secrets cluster-wide", namespacedSecrets)
	}

	// The sample RoleBinding: kmm-secret-reader (which the component keeps) for the operator.
	root, _ := tools(t)
	data, err := os.ReadFile(filepath.Join(root, sampleRoleBinding))
	if err != nil {
		t.Fatal(err)
	}
	sample, err := install.Decode(data)
	if err != nil || len(sample) != 1 || sample[0].GetKind() != "RoleBinding" {
		t.Fatalf("%s: want one RoleBinding, got %d objects (%v)", sampleRoleBinding, len(sample), err)
	}
	ref, _, _ := unstructured.NestedStringMap(sample[0].Object, "roleRef")
	if ref["kind"] != "ClusterRole" || ref["name"] != secretReaderRole || install.Find(namespaced, "ClusterRole", secretReaderRole) == nil {
		t.Errorf("%s refers to %s %s; want the ClusterRole %s of the install", sampleRoleBinding, ref["kind"], ref["name"], secretReaderRole)
	}
	with := operatorGrants(t, append(slices.Clone(namespaced), sample...))
	if !with[grant{"", "secrets", "get", "", sample[0].GetNamespace()}] || len(with) != len(scoped)+1 {
		t.Errorf("%s should add exactly get on Secrets in %s for the operator", sampleRoleBinding, sample[0].GetNamespace())
	}
}

// TestSecurityTableMatchesRBAC keeps docs/install.md's Security table and config/rbac in step:
// every permission the installed operator holds is a row (with its reason), and every row is held.
func TestSecurityTableMatchesRBAC(t *testing.T) {
	root, _ := tools(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := securityTable(t, string(doc))
	held := operatorGrants(t, render(t, "default"))
	var missing, extra []string
	for g := range held {
		if !documented[g] {
			missing = append(missing, g.String())
		}
	}
	for g := range documented {
		if !held[g] {
			extra = append(extra, g.String())
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	for _, m := range missing {
		t.Errorf("held but not in docs/install.md's Security table: %s", m)
	}
	for _, e := range extra {
		t.Errorf("in docs/install.md's Security table but not held (config/default): %s", e)
	}
}

// securityTable parses the table of docs/install.md's "## Security" section:
// | API group | resources | verbs | names | scope | why |, lists comma-separated, `core` for
// the core group, `any` for no resourceNames. Every row must say why.
func securityTable(t *testing.T, doc string) map[grant]bool {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## Security\n")
	if !ok {
		t.Fatal(`docs/install.md has no "## Security" section`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	out := map[grant]bool{}
	inTable := false
	for _, line := range strings.Split(section, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "| API group |") {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(out) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 6 {
			t.Fatalf("a Security table row with %d cells, want 6: %s", len(cells), line)
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "`", ""))
		}
		if len(cells[5]) < 10 {
			t.Errorf("a Security table row without its reason: %s", line)
		}
		group := cells[0]
		if group == "core" {
			group = ""
		}
		names := splitList(cells[3])
		if slices.Equal(names, []string{"any"}) {
			names = []string{""}
		}
		for _, res := range splitList(cells[1]) {
			for _, v := range splitList(cells[2]) {
				for _, n := range names {
					out[grant{group, res, v, n, cells[4]}] = true
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("docs/install.md's Security section has no permission table")
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// TestMetricsMonitorVerifiesTheOperator checks config/prometheus's ServiceMonitor: it verifies the
// metrics endpoint (no insecureSkipVerify) with the CA of the Secret the operator's certificate
// lives in, for the metrics Service's name, which the certificate covers both as kmm issues it
// (config/default) and as cert-manager does (config/cert-manager).
func TestMetricsMonitorVerifiesTheOperator(t *testing.T) {
	monitor := install.Find(render(t, "prometheus"), "ServiceMonitor", monitorName)
	if monitor == nil {
		t.Fatal("no ServiceMonitor")
	}
	if path := findKey(monitor.Object, "insecureSkipVerify", ""); path != "" {
		t.Errorf("the ServiceMonitor sets %s", path)
	}
	caSecret, caKey, serverName := monitorTLS(t, monitor)

	def := render(t, "default")
	svc := install.Find(def, "Service", metricsServiceName)
	if want := svc.GetName() + "." + svc.GetNamespace() + ".svc"; serverName != want {
		t.Errorf("the ServiceMonitor expects a certificate for %q, the metrics Service is %s", serverName, want)
	}
	if monitor.GetNamespace() != svc.GetNamespace() {
		t.Errorf("the ServiceMonitor is in %q: the Prometheus Operator reads its CA Secret there, the Secret is in %s", monitor.GetNamespace(), svc.GetNamespace())
	}
	a := parsedArgs(t, def)
	if caSecret != a.Certs.SecretName || caKey != certs.CAFile {
		t.Errorf("the ServiceMonitor trusts %s[%s], the operator keeps its CA in %s[%s]", caSecret, caKey, a.Certs.SecretName, certs.CAFile)
	}
	if !a.MetricsSecure || !slices.Contains(a.Certs.DNSNames(), serverName) {
		t.Errorf("config/default: secure metrics %v with a certificate for %v; the ServiceMonitor expects %s", a.MetricsSecure, a.Certs.DNSNames(), serverName)
	}

	cm := render(t, "cert-manager")
	cert := install.Find(cm, "Certificate", "kmm-serving-cert")
	if cert == nil {
		t.Fatal("config/cert-manager: no Certificate kmm-serving-cert")
	}
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	if !slices.Contains(dnsNames, serverName) || secretName != caSecret {
		t.Errorf("config/cert-manager: cert-manager issues %v into %s; the ServiceMonitor expects %s with the CA of %s", dnsNames, secretName, serverName, caSecret)
	}
	if a := parsedArgs(t, cm); !a.MetricsSecure || a.DisableWebhook {
		t.Error("config/cert-manager: the operator does not serve its metrics with the webhook's certificate")
	}
}

// monitorTLS returns the CA Secret, its key and the server name of the ServiceMonitor's endpoint.
func monitorTLS(t *testing.T, monitor *unstructured.Unstructured) (secret, key, serverName string) {
	t.Helper()
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("the ServiceMonitor has %d endpoints, want 1", len(endpoints))
	}
	ep := endpoints[0].(map[string]any)
	secret, _, _ = unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "name")
	key, _, _ = unstructured.NestedString(ep, "tlsConfig", "ca", "secret", "key")
	serverName, _, _ = unstructured.NestedString(ep, "tlsConfig", "serverName")
	if secret == "" || key == "" || serverName == "" {
		t.Fatalf("the ServiceMonitor's tlsConfig %v names no CA Secret and key or no serverName", ep["tlsConfig"])
	}
	return secret, key, serverName
}

// findKey returns the path of the first key named key in v, or "".
func findKey(v any, key, path string) string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == key {
				return path + "." + k
			}
			if p := findKey(e, key, path+"."+k); p != "" {
				return p
			}
		}
	case []any:
		for i, e := range x {
			if p := findKey(e, key, fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
	}
	return ""
}
