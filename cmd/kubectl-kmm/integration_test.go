package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/poll"
	"github.com/kmm-project/kmm/test/testbed"
)

const kernel = testbed.KernelA

// cluster is the package's control plane (test/testbed): kube-apiserver, etcd, the kube
// controllers and the simulated kubelet; each test starts the operator it needs.
var cluster *testbed.Cluster

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // the operator's logs are not what these tests look at
	c, err := testbed.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cluster = c
	os.Exit(c.Run(m))
}

// TestAgainstTheOperator runs the operator and the simulated kubelet on a real API server, loads a
// Module on three nodes and checks what `kubectl kmm` prints about them.
func TestAgainstTheOperator(t *testing.T) {
	ctx := context.Background()
	cluster.StartOperator(t)
	k8s := cluster.Client
	kubeconfig := writeKubeconfig(t, cluster.Env)
	nodes := startNodes(ctx, t, "kmm-cli-test", 3)

	// Before any Module, there is no NMC: the CLI says what that means, and it is not an error.
	if out, err := kmm(t, "status", "--kubeconfig", kubeconfig); err != nil || !strings.Contains(out, "no NodeModulesConfig exists") {
		t.Fatalf("status on an empty cluster: %q, %v", out, err)
	}
	if _, err := kmm(t, "status", "drivers/nic", "--kubeconfig", kubeconfig); err == nil || err.Error() != "module drivers/nic not found" {
		t.Fatalf("status of a missing module: %v", err)
	}

	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "drivers"}}); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, testModule("drivers", "nic", "kmm-cli-test")); err != nil {
		t.Fatal(err)
	}
	waitModuleReady(t, k8s, "drivers", "nic")

	out, err := kmm(t, "status", "--kubeconfig", kubeconfig, "--width", "100")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl kmm status:\n%s", out)
	checkStatusTable(t, out, nodes)

	out, err = kmm(t, "status", "nic", "-n", "drivers", "--kubeconfig", kubeconfig)
	if err != nil || !strings.HasPrefix(out, "drivers/nic: Ready (AllLoaded), loaded on 3/3 nodes\n") {
		t.Errorf("status of one module (%v):\n%s", err, out)
	}

	out, err = kmm(t, "history", nodes[0], "drivers/nic", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl kmm history %s drivers/nic:\n%s", nodes[0], out)
	for _, want := range []string{"Absent → Loading", "Loading → Loaded", "SpecSet", "WorkerSucceeded"} {
		if !strings.Contains(out, want) {
			t.Errorf("history lacks %q:\n%s", want, out)
		}
	}
	checkJSON(t, kubeconfig, nodes)
	checkPrinters(t, kubeconfig, nodes)
	checkImpersonation(t, kubeconfig, nodes)
	checkCompletion(t, kubeconfig)

	// A Module whose image cannot be pulled: the table says so on every node, with the failure class.
	broken := testModule("drivers", "accel", "kmm-cli-test")
	broken.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/broken/accel:1"
	if err := k8s.Create(ctx, broken); err != nil {
		t.Fatal(err)
	}
	// One table must show all three: the first back-off is short, so a second call may already see
	// a retry (Loading) on a busy machine.
	poll.Until(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) {
		o, err := kmm(t, "status", "--kubeconfig", kubeconfig, "--width", "100")
		return err == nil && backOffRows(o) == 3 && strings.Contains(o, "Degraded WorkerFailing"),
			fmt.Sprintf("3 rows of drivers/accel in LoadBackOff for an image pull and Degraded WorkerFailing (error %v):\n%s", err, o)
	})
}

// backOffRows counts the rows of drivers/accel in LoadBackOff for an image pull.
func backOffRows(out string) int {
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " drivers/accel  LoadBackOff ") && strings.Contains(l, "ImagePull: pulling reg.example") {
			n++
		}
	}
	return n
}

// checkStatusTable asserts one Loaded row of drivers/nic per node under the summary.
func checkStatusTable(t *testing.T, out string, nodes []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 6 || lines[0] != "drivers/nic: Ready (AllLoaded), loaded on 3/3 nodes" || lines[1] != "" ||
		!strings.HasPrefix(lines[2], "NODE") {
		t.Fatalf("status is not a summary, a blank line, a header and 3 rows:\n%s", out)
	}
	for i, n := range nodes {
		f := strings.Fields(lines[3+i])
		if len(f) < 6 || f[0] != n || f[1] != "drivers/nic" || f[2] != "Loaded" || f[4] != "0" || !strings.HasPrefix(f[5], "WorkerSucceeded") {
			t.Errorf("row %d: %q, want node %s with drivers/nic Loaded", i, lines[3+i], n)
		}
	}
	for _, l := range lines {
		if runeLen(l) > 100 {
			t.Errorf("line wider than 100 columns: %q", l)
		}
	}
}

// checkJSON parses `status -o json` and `history -o json`.
func checkJSON(t *testing.T, kubeconfig string, nodes []string) {
	t.Helper()
	out, err := kmm(t, "status", "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var list rowList[PairRow]
	if err := json.Unmarshal([]byte(out), &list); err != nil || list.Kind != "List" || list.APIVersion != "v1" {
		t.Fatalf("status -o json is not a List of rows: %v\n%s", err, out)
	}
	rows := list.Items
	if len(rows) != 3 {
		t.Fatalf("status -o json has %d rows, want 3:\n%s", len(rows), out)
	}
	for i, r := range rows {
		if r.Node != nodes[i] || r.Module != "drivers/nic" || r.State != "Loaded" || r.Since == nil ||
			r.LoadedImage != "reg.example.com/nic:a" || r.Kernel != kernel {
			t.Errorf("JSON row %d: %+v", i, r)
		}
	}
	out, err = kmm(t, "history", nodes[2], "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var histList rowList[HistoryRow]
	err = json.Unmarshal([]byte(out), &histList)
	hist := histList.Items
	if err != nil || len(hist) < 2 {
		t.Fatalf("history -o json (%v):\n%s", err, out)
	}
	if first, last := hist[0], hist[len(hist)-1]; first.From != "Absent" || first.To != "Loading" || last.To != "Loaded" || last.Node != nodes[2] {
		t.Errorf("history -o json: %+v", hist)
	}
}

// kmm runs the command and returns its stdout; stderr must stay empty on success.
func kmm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, args, &out, &errOut)
	if err == nil && errOut.Len() > 0 {
		t.Errorf("kubectl kmm %v wrote to stderr:\n%s", args, errOut.String())
	}
	return out.String(), err
}

// startNodes adds n nodes labelled label=yes to the test bed's simulated kubelet and returns their
// names.
func startNodes(ctx context.Context, t *testing.T, label string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("node-%d", i+1)
		if err := cluster.Agent.AddNode(ctx, name, kernel, map[string]string{label: "yes"}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

func testModule(ns, name, label string) *kmmv1beta1.Module {
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{label: "yes"},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: name},
				KernelMappings: []kmmv1beta1.KernelMapping{{Literal: kernel, ContainerImage: "reg.example.com/" + name + ":a"}},
			}},
		},
	}
}

// waitModuleReady waits until every pair of the Module is Loaded and its status says so.
func waitModuleReady(t *testing.T, k8s client.Client, ns, name string) {
	t.Helper()
	eventually(t, "the Module to be Ready on 3 of 3 nodes", func() bool {
		m := &kmmv1beta1.Module{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
			return false
		}
		return meta.IsStatusConditionTrue(m.Status.Conditions, kmmv1beta1.ConditionReady) &&
			m.Status.ModuleLoader.AvailableNumber == 3 && m.Status.NodesByState[kmmv1beta1.StateLoaded] == 3
	})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) { return cond(), what })
}

// writeKubeconfig writes a kubeconfig that reaches env as its administrator.
func writeKubeconfig(t *testing.T, env *envtest.Env) string {
	t.Helper()
	path, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return path
}
