package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// checkPrinters checks cli-runtime's printers on the three Loaded rows of drivers/nic: every
// assertion is on the values printed, so a printer fed the wrong object (or none) fails it.
func checkPrinters(t *testing.T, kubeconfig string, nodes []string) {
	t.Helper()
	out, err := kmm(t, "status", "drivers/nic", "-o", "yaml", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var list rowList[PairRow]
	if err := yaml.UnmarshalStrict([]byte(out), &list); err != nil || list.Kind != "List" || len(list.Items) != 3 {
		t.Fatalf("status -o yaml is not a List of 3 rows (%v):\n%s", err, out)
	}
	for i, r := range list.Items {
		if r.Node != nodes[i] || r.Module != "drivers/nic" || r.State != "Loaded" || r.Kernel != kernel || r.Since == nil {
			t.Errorf("status -o yaml item %d: %+v", i, r)
		}
	}

	jsonpath := `-o=jsonpath={range .items[*]}{.node} {.module} {.state}{"\n"}{end}`
	want := "node-1 drivers/nic Loaded\nnode-2 drivers/nic Loaded\nnode-3 drivers/nic Loaded\n"
	if out, err := kmm(t, "status", jsonpath, "--kubeconfig", kubeconfig); err != nil || out != want {
		t.Errorf("status %s (%v):\n%q\nwant\n%q", jsonpath, err, out, want)
	}
	if out, err := kmm(t, "status", "-n", "drivers", "nic", "-o", "go-template={{range .items}}{{.node}}={{.state}};{{end}}",
		"--kubeconfig", kubeconfig); err != nil || out != "node-1=Loaded;node-2=Loaded;node-3=Loaded;" {
		t.Errorf("status -o go-template (%v): %q", err, out)
	}
	wantNames := "nodemodulesconfig.kmm.sigs.x-k8s.io/node-1\nnodemodulesconfig.kmm.sigs.x-k8s.io/node-2\n" +
		"nodemodulesconfig.kmm.sigs.x-k8s.io/node-3\n"
	if out, err := kmm(t, "status", "-o", "name", "--kubeconfig", kubeconfig); err != nil || out != wantNames {
		t.Errorf("status -o name (%v):\n%s", err, out)
	}
	if out, err := kmm(t, "history", nodes[1], "drivers/nic", "-o", "jsonpath={.items[*].to}", "--kubeconfig", kubeconfig); err != nil ||
		out != "Loading Loaded" {
		t.Errorf("history -o jsonpath (%v): %q", err, out)
	}
}

// checkImpersonation creates RBAC for three users and runs status as each with --as (the
// kubeconfig's administrator may impersonate): alice may read both kinds and sees the table, bob
// may read nothing and carol only Modules; both get an error naming what they may not list.
// dave may get and list but not watch: status works, status -w fails naming the watch.
func checkImpersonation(t *testing.T, kubeconfig string, nodes []string) {
	t.Helper()
	grant(t, "alice", []string{"modules", "nodemodulesconfigs"}, "get", "list", "watch")
	grant(t, "carol", []string{"modules"}, "get", "list", "watch")
	grant(t, "dave", []string{"modules", "nodemodulesconfigs"}, "get", "list")

	// RBAC takes effect when the API server's informers see the binding.
	var out string
	eventually(t, "alice to be allowed", func() bool {
		var err error
		out, err = kmm(t, "status", "--as", "alice", "--kubeconfig", kubeconfig, "--width", "100")
		return err == nil
	})
	checkStatusTable(t, out, nodes)

	for user, want := range map[string]string{
		"bob":   `modules.kmm.sigs.x-k8s.io is forbidden: User "bob" cannot list resource "modules"`,
		"carol": `nodemodulesconfigs.kmm.sigs.x-k8s.io is forbidden: User "carol" cannot list resource "nodemodulesconfigs"`,
	} {
		out, err := kmm(t, "status", "--as", user, "--kubeconfig", kubeconfig)
		if err == nil || !strings.Contains(err.Error(), want) || out != "" {
			t.Errorf("status --as %s: %v (stdout %q), want an error containing %q", user, err, out, want)
		}
	}

	eventually(t, "dave to be allowed to list", func() bool {
		_, err := kmm(t, "status", "--as", "dave", "--kubeconfig", kubeconfig)
		return err == nil
	})
	want := `User "dave" cannot watch resource "nodemodulesconfigs"`
	if _, err := kmm(t, "status", "-w", "--as", "dave", "--kubeconfig", kubeconfig); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("status -w --as dave: %v, want an error containing %q", err, want)
	}
}

// grant binds user to a ClusterRole with verbs on resources of kmm's group.
func grant(t *testing.T, user string, resources []string, verbs ...string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kmm-cli-test-" + user},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"kmm.sigs.x-k8s.io"}, Resources: resources, Verbs: verbs}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if err := cluster.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.Delete(ctx, binding)
		_ = cluster.Client.Delete(ctx, role)
	})
}

// checkCompletion checks the completions that come from the cluster: Modules for status, nodes
// (their NMCs) for history, the namespaces holding Modules for -n.
func checkCompletion(t *testing.T, kubeconfig string) {
	t.Helper()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", ""}, "drivers/nic\n"},
		{[]string{"status", "-n", "drivers", ""}, "nic\n"},
		{[]string{"history", ""}, "node-1\nnode-2\nnode-3\n"},
		{[]string{"history", "node-1", ""}, "drivers/nic\n"},
		{[]string{"status", "-n", ""}, "drivers\n"},
	} {
		var out, log bytes.Buffer
		args := append([]string{"__complete", "--kubeconfig", kubeconfig}, tc.args...)
		if err := run(context.Background(), args, &out, &log); err != nil || !strings.HasPrefix(out.String(), tc.want+":4\n") {
			t.Errorf("kubectl kmm %q (%v):\n%s\nwant %q, then the no-file directive", args, err, out.String(), tc.want)
		}
	}
}
