package preflightbed

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/preflight"
	"github.com/kmm-project/kmm/test/envtest"
	"github.com/kmm-project/kmm/test/poll"
)

// k8s reaches the envtest API server, on which the whole operator runs (webhook included).
var k8s client.Client

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard())
	env, err := envtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	opts := app.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr = "0", "0"
	opts.WebhookHost, opts.WebhookPort, opts.WebhookCertDir = env.WebhookHost, env.WebhookPort, env.WebhookCertDir
	opts.PreflightCheckTimeout = 5 * time.Second
	mgr, err := app.New(env.Config, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	defer func() { cancel(); <-done }()
	check := mgr.GetWebhookServer().StartedChecker()
	for deadline := time.Now().Add(30 * time.Second); check(nil) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "the webhook server did not start within 30s")
			return 1
		}
	}
	if k8s, err = client.New(env.Config, client.Options{Scheme: app.NewScheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// TestPreflightValidation creates a PreflightValidation for the target kernel over the five Modules
// of the scenario and checks the status the operator writes (reason, verification status and stage,
// message, transition time per Module), the Events of the failures, and that the CLI's function
// (preflight.Run and its table) says the same; then a Module change is re-checked and a deleted
// Module leaves the status.
func TestPreflightValidation(t *testing.T) {
	ctx := context.Background()
	s := Setup(ctx, t, k8s, "pf")
	pv := &kmmv1beta2.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "upgrade"}, Spec: kmmv1beta2.PreflightValidationSpec{KernelVersion: Target}}
	if err := k8s.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, s, pv)
	t.Logf("status: %+v", pv.Status.Modules)

	checkEvents(t, pv.Name, "PreflightNoMapping", "PreflightImageMissing", "PreflightUnauthorized")

	// The CLI's function, on the same cluster: the same verdicts, and a table that says them.
	verdicts, err := preflight.Run(ctx, k8s, preflight.Options{Kernel: Target})
	if err != nil {
		t.Fatal(err)
	}
	if p := s.CheckVerdicts(verdicts); len(p) > 0 {
		t.Fatalf("preflight.Run (the CLI) disagrees:\n%s", strings.Join(p, "\n"))
	}
	var table bytes.Buffer
	if err := preflight.WriteTable(&table, Target, s.Mine(verdicts)); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl kmm preflight %s:\n%s", Target, table.String())
	if p := CheckTable(s, table.String()); len(p) > 0 {
		t.Fatalf("the table:\n%s", strings.Join(p, "\n"))
	}

	// A Module change is re-checked: the missing image now names the served one.
	m := &kmmv1beta1.Module{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: s.NS, Name: "missing"}, m); err != nil {
		t.Fatal(err)
	}
	m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = s.Public.Host + "/kmod/served:$KERNEL_FULL_VERSION"
	if err := k8s.Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	s.Want[s.NS+"/missing"] = kmmv1beta1.PreflightReasonSuccess
	waitStatus(t, s, pv)

	// A deleted Module leaves the status.
	if err := k8s.Delete(ctx, &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: "nomapping"}}); err != nil {
		t.Fatal(err)
	}
	delete(s.Want, s.NS+"/nomapping")
	waitStatus(t, s, pv)
}

// waitStatus waits until pv's status says what s.Want says.
func waitStatus(t *testing.T, s *Scenario, pv *kmmv1beta2.PreflightValidation) {
	t.Helper()
	poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(pv), pv); err != nil {
			return false, err.Error()
		}
		p := s.CheckStatus(pv)
		return len(p) == 0, strings.Join(p, "; ")
	})
}

// checkEvents waits for a Warning Event of each reason regarding the PreflightValidation.
func checkEvents(t *testing.T, pvName string, reasons ...string) {
	t.Helper()
	poll.Until(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		evs := &eventsv1.EventList{}
		if err := k8s.List(context.Background(), evs); err != nil {
			return false, err.Error()
		}
		return len(MissingEvents(evs.Items, pvName, reasons...)) == 0, fmt.Sprint("Events ", MissingEvents(evs.Items, pvName, reasons...))
	})
}

// TestAdmission: the schema and the webhook reject what kmm does not do, naming the field, and
// accept upstream's pushBuiltImage.
func TestAdmission(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name      string
		spec      kmmv1beta1.PreflightValidationSpec
		field     string
		wantInMsg string
	}{
		{"kernel that is no kernel", kmmv1beta1.PreflightValidationSpec{KernelVersion: "6.1/../x"}, "spec.kernelVersion", "not a kernel version"},
		{"no kernel", kmmv1beta1.PreflightValidationSpec{}, "spec.kernelVersion", ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pv := &kmmv1beta1.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bad-%d", i)}, Spec: c.spec}
			err := k8s.Create(ctx, pv)
			if p := CheckRejected(err, c.field, c.wantInMsg); p != "" {
				t.Fatal(p)
			}
		})
	}
	// The sample in config/samples is admitted.
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "kmm_v1beta1_preflightvalidation.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	sample := &kmmv1beta1.PreflightValidation{}
	if err := yaml.UnmarshalStrict(data, sample); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Create(ctx, sample); err != nil {
		t.Fatalf("the sample is rejected: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), sample) })

	// Upstream's pushBuiltImage is accepted (issue 37; it has no effect until kmm builds).
	push := &kmmv1beta1.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "push"}, Spec: kmmv1beta1.PreflightValidationSpec{KernelVersion: Target, PushBuiltImage: true}}
	if err := k8s.Create(ctx, push); err != nil {
		t.Fatalf("pushBuiltImage: true is rejected: %v", err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), push) })

	// Upstream's Build and Sign stages cannot be written to the status.
	pv := &kmmv1beta1.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "stages"}, Spec: kmmv1beta1.PreflightValidationSpec{KernelVersion: "5.14.0-1.el9.x86_64"}}
	if err := k8s.Create(ctx, pv); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), pv) })
	for _, stage := range []string{"Build", "Sign"} {
		// The operator writes the status too: a conflict is retried on a fresh read.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(pv), pv); err != nil {
				return err
			}
			pv.Status.Modules = []kmmv1beta1.PreflightValidationModuleStatus{{Namespace: "a", Name: "b", VerificationStatus: "False",
				VerificationStage: stage, LastTransitionTime: metav1.Now()}}
			return k8s.Status().Update(ctx, pv)
		})
		if p := CheckRejected(err, "status.modules[0].verificationStage", "no Build or Sign stage"); p != "" {
			t.Fatalf("stage %s: %s", stage, p)
		}
	}
}

// CheckRejected says what is wrong with err as a rejection naming field with a message holding
// want ("" when right).
func CheckRejected(err error, field, want string) string {
	switch {
	case err == nil:
		return "accepted, want rejected"
	case !apierrors.IsInvalid(err):
		return fmt.Sprintf("rejected with %v, want Invalid", err)
	case !strings.Contains(err.Error(), field) || !strings.Contains(err.Error(), want):
		return fmt.Sprintf("rejected with %q, want the field %s and %q", err.Error(), field, want)
	}
	return ""
}
