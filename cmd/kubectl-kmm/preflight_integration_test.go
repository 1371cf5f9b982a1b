package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/preflight"
	"github.com/kmm-project/kmm/test/preflightbed"
)

// TestPreflightAgainstTheOperator runs the operator on a real API server with the five Modules of
// the preflight scenario (two in-process registries, one behind basic auth), lets the operator
// verify a PreflightValidation, and checks that `kubectl kmm preflight <kernel>` (table and
// -o json) and `--from-node <canary>` say what the operator wrote, Module by Module.
func TestPreflightAgainstTheOperator(t *testing.T) {
	ctx := context.Background()
	cluster.StartOperator(t)
	k8s := cluster.Client
	kubeconfig := writeKubeconfig(t, cluster.Env)
	s := preflightbed.Setup(ctx, t, k8s, "pf-cli")
	pv := &kmmv1beta2.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "cli"}, Spec: kmmv1beta2.PreflightValidationSpec{KernelVersion: preflightbed.Target}}
	if err := k8s.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the operator's verdicts", func() bool {
		return k8s.Get(ctx, client.ObjectKeyFromObject(pv), pv) == nil && len(s.CheckStatus(pv)) == 0
	})

	out, err := kmm(t, "preflight", preflightbed.Target, "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl kmm preflight %s:\n%s", preflightbed.Target, out)
	if p := preflightbed.CheckTable(s, out); len(p) > 0 {
		t.Errorf("the table:\n%s", strings.Join(p, "\n"))
	}
	// Other tests' Modules share the cluster: the count is theirs too.
	if !strings.Contains(out, "kernel "+preflightbed.Target+": ") || !strings.Contains(out, " Modules served\n") {
		t.Errorf("no summary line:\n%s", out)
	}

	for _, args := range [][]string{{"preflight", preflightbed.Target, "-o", "json"}, {"preflight", "--from-node", s.Canary, "-o", "json"}} {
		out, err := kmm(t, append(args, "--kubeconfig", kubeconfig)...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		var list struct{ Items []preflight.Verdict }
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("%v: not JSON: %v\n%s", args, err, out)
		}
		if p := s.CheckVerdicts(list.Items); len(p) > 0 {
			t.Errorf("%v:\n%s", args, strings.Join(p, "\n"))
		}
		// The same as the operator wrote, Module by Module.
		stored := map[string]preflight.Verdict{}
		for _, e := range pv.Status.Modules {
			stored[e.Namespace+"/"+e.Name] = preflight.VerdictOf(e)
		}
		for _, v := range s.Mine(list.Items) {
			if st := stored[v.Key()]; st.Reason != v.Reason || st.Verified != v.Verified || st.Image != v.Image {
				t.Errorf("%v: %s: the CLI says %+v, the operator %+v", args, v.Key(), v, st)
			}
		}
	}

	if _, err := kmm(t, "preflight", "--kubeconfig", kubeconfig); err == nil {
		t.Error("preflight without a kernel or a node succeeded")
	}
	if _, err := kmm(t, "preflight", "--from-node", "no-such-node", "--kubeconfig", kubeconfig); err == nil || !strings.Contains(err.Error(), "node no-such-node not found") {
		t.Errorf("--from-node of a missing node: %v", err)
	}
}
