package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/netport"
	"github.com/kmm-project/kmm/test/poll"
)

// TestManagerServesProbesMetricsAndElectsALeader runs the operator command against a real API server
// and checks what an administrator would: the probes answer, the metrics endpoint serves the leader
// election gauge, and the Lease is held.
func TestManagerServesProbesMetricsAndElectsALeader(t *testing.T) {
	kubeconfig := writeKubeconfig(t, env)
	metricsAddr, probeAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{
			"--kubeconfig", kubeconfig,
			"--metrics-bind-address", metricsAddr,
			"--health-probe-bind-address", probeAddr,
			"--leader-elect", "--leader-elect-namespace", "default",
			"--webhook-host", env.WebhookHost, "--webhook-port", fmt.Sprint(env.WebhookPort),
			"--webhook-cert-dir", env.WebhookCertDir,
			"--kube-api-qps", "20", "--kube-api-burst", "40",
		}, &logs)
	}()

	waitFor(t, "/readyz to answer 200", func() bool { return get(probeAddr, "/readyz") == http.StatusOK })
	if code := get(probeAddr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	waitFor(t, "the leader election gauge", func() bool {
		return strings.Contains(body(metricsAddr, "/metrics"), `leader_election_master_status{name="`+app.LeaderElectionID+`"} 1`)
	})
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: app.LeaderElectionID}, lease); err != nil {
		t.Fatalf("the leader election Lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("the Lease has no holder: %+v", lease.Spec)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after cancel", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the manager did not stop within 30s of its context ending")
	}
	if !strings.Contains(logs.String(), `"message":"Starting the manager"`) {
		t.Fatalf("the log has no structured start line:\n%s", logs.String())
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"unknown flag":       {args: []string{"--no-such-flag"}, want: "flag provided but not defined"},
		"bad log level":      {args: []string{"--log-level", "loud"}, want: `unknown log level "loud"`},
		"missing kubeconfig": {args: []string{"--kubeconfig", "testdata/none"}, want: "loading the kubeconfig"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%v) = %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	o := app.DefaultOptions()
	o.QPS = 0
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "kube-api-qps and kube-api-burst must be positive") {
		t.Fatalf("Validate() = %v", err)
	}
	o = app.DefaultOptions()
	o.WebhookPort = 70000
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "webhook-port must be a TCP port") {
		t.Fatalf("Validate() = %v", err)
	}
	o = app.DefaultOptions()
	o.CertManagement = "cert-manager"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "cert-management must be self or none") {
		t.Fatalf("Validate() = %v", err)
	}
	o = app.DefaultOptions()
	o.CertManagement, o.Certs.Validity, o.Certs.RefreshBefore = "self", time.Hour, time.Hour
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "cert-validity (1h0m0s) must exceed cert-refresh-before") {
		t.Fatalf("Validate() = %v", err)
	}
	o.DisableWebhook = true
	if err := o.Validate(); err != nil {
		t.Fatalf("without the webhook the certificate settings do not matter: %v", err)
	}
	for _, sandbox := range []string{"sandbox", "/", "//"} {
		o = app.DefaultOptions()
		o.WorkerDryRunSandbox = sandbox
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "worker-dry-run-sandbox must be an absolute host directory other than /") {
			t.Fatalf("Validate() with the sandbox %q = %v", sandbox, err)
		}
	}
	o.WorkerDryRunSandbox = "/var/lib/kmm-sandbox"
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate() with an absolute sandbox: %v", err)
	}
	// 1500ms: the Lease would say 1 s, the renew deadline's own length (client-go truncates).
	for _, le := range [][3]time.Duration{{time.Second, time.Second, 0}, {0, 20 * time.Second, 0}, {0, 0, 10 * time.Second}, {-time.Second, 0, 0},
		{1500 * time.Millisecond, time.Second, 150 * time.Millisecond}} {
		o = app.DefaultOptions()
		o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = le[0], le[1], le[2]
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "leader") {
			t.Fatalf("Validate() with the leader election timing %v = %v", le, err)
		}
	}
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = time.Second, 750*time.Millisecond, 150*time.Millisecond
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate() with a short leader election timing: %v", err)
	}
}

func TestParseArgs(t *testing.T) {
	a, err := app.ParseArgs([]string{"--kubeconfig=/k", "--log-level=debug", "--cert-management=self", "--worker-image=reg/w:1", "--metrics-secure",
		"--worker-dry-run-sandbox=/sandbox", "--leader-elect-lease-duration=3s", "--leader-elect-renew-deadline=2s", "--leader-elect-retry-period=500ms"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Kubeconfig != "/k" || a.LogLevel != "debug" || a.CertManagement != "self" || a.WorkerImage != "reg/w:1" || !a.MetricsSecure ||
		a.WorkerDryRunSandbox != "/sandbox" || a.LeaseDuration != 3*time.Second || a.RenewDeadline != 2*time.Second || a.RetryPeriod != 500*time.Millisecond {
		t.Fatalf("ParseArgs = %+v", a)
	}
	if d := app.DefaultOptions(); a.QPS != d.QPS || a.Certs != d.Certs {
		t.Fatalf("unset flags moved from their defaults: %+v", a.Options)
	}
	if _, err := app.ParseArgs([]string{"stray"}); err == nil || !strings.Contains(err.Error(), "unexpected arguments: stray") {
		t.Fatalf("a positional argument: %v", err)
	}
}

func writeKubeconfig(t *testing.T, env *envtest.Env) string {
	t.Helper()
	path, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := netport.Free("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func get(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func body(addr, path string) string {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) { return cond(), what })
}

// env is the control plane shared by the tests of this package.
var env *envtest.Env

func TestMain(m *testing.M) {
	var err error
	env, err = envtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}
