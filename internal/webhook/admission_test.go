package webhook_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/internal/validation"
	"github.com/kmm-project/kmm/test/envtest"
)

// k8s is a client of the envtest API server, with the kmm validating webhook served by a real manager.
var k8s client.Client

func TestMain(m *testing.M) {
	os.Exit(runWithControlPlane(m))
}

func runWithControlPlane(m *testing.M) int {
	env, err := envtest.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()

	opts := app.DefaultOptions()
	opts.MetricsAddr, opts.ProbeAddr, opts.DisableControllers = "0", "0", true
	opts.WebhookHost, opts.WebhookPort, opts.WebhookCertDir = env.WebhookHost, env.WebhookPort, env.WebhookCertDir
	mgr, err := app.New(env.Config, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	if err := waitForWebhook(mgr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k8s, err = client.New(env.Config, client.Options{Scheme: app.NewScheme()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func waitForWebhook(mgr ctrl.Manager) error {
	check := mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for check(nil) != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("the webhook server did not start within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

var namespaceCounter atomic.Int32

// newNamespace creates a namespace for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("adm-%d", namespaceCounter.Add(1))}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// manifest is a testdata file: a Module and, for invalid ones, the field and message expected in
// the rejection (from "# field:" and "# want:" header lines).
type manifest struct {
	name      string
	obj       *unstructured.Unstructured
	wantField string
	wantMsg   string
	// clean: the rejection must not carry the API server's "some validation rules were not
	// checked" (a "# clean" header line).
	clean bool
}

func readManifests(t *testing.T, dir string) []manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in testdata/%s: %v", dir, err)
	}
	out := make([]manifest, 0, len(files))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := manifest{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), obj: &unstructured.Unstructured{}}
		m.wantField, m.wantMsg = headers(data)
		m.clean = bytes.Contains(data, []byte("\n# clean\n"))
		if err := yaml.Unmarshal(data, &m.obj.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, m)
	}
	return out
}

func headers(data []byte) (wantField, wantMsg string) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "# field: "); ok {
			wantField = v
		}
		if v, ok := strings.CutPrefix(line, "# want: "); ok {
			wantMsg = v
		}
	}
	return wantField, wantMsg
}

// TestValidModulesAreAcceptedAndReadBackEqual applies manifests in the style of the upstream KMM
// documentation and checks that every field given comes back as given (nothing pruned or changed).
func TestValidModulesAreAcceptedAndReadBackEqual(t *testing.T) {
	manifests := readManifests(t, "valid")
	if len(manifests) < 8 {
		t.Fatalf("want at least 8 valid manifests, have %d", len(manifests))
	}
	ns := newNamespace(t)
	for _, m := range manifests {
		t.Run(m.name, func(t *testing.T) {
			obj := m.obj.DeepCopy()
			obj.SetNamespace(ns)
			if err := k8s.Create(context.Background(), obj); err != nil {
				t.Fatalf("create rejected: %v", err)
			}
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(kmmv1beta1.GroupVersion.WithKind("Module"))
			if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), got); err != nil {
				t.Fatal(err)
			}
			if diff := missingFrom(m.obj.Object["spec"], got.Object["spec"], "spec"); diff != "" {
				t.Fatalf("read back differs from the manifest: %s", diff)
			}
			typed := &kmmv1beta1.Module{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, typed); err != nil {
				t.Fatalf("read back does not decode into the Go type: %v", err)
			}
			if errs := validation.Admission(typed); len(errs) != 0 {
				t.Fatalf("the controllers' re-check of admission's rules rejects an admitted Module: %v", errs.ToAggregate())
			}
			// The re-check holds back nothing admission accepts (build and sign included).
			if errs := validation.Module(typed); len(errs) != 0 {
				t.Fatalf("validation.Module() = %v, want no error", errs.ToAggregate())
			}
		})
	}
}

// missingFrom returns where want has a value that got lacks or holds differently ("" when want ⊆ got).
func missingFrom(want, got any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: want an object, got %v", path, got)
		}
		for k, v := range w {
			if d := missingFrom(v, g[k], path+"."+k); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: want %v, got %v", path, w, got)
		}
		for i := range w {
			if d := missingFrom(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(normalizeNumber(want), normalizeNumber(got)) {
			return fmt.Sprintf("%s: want %v, got %v", path, want, got)
		}
		return ""
	}
}

func normalizeNumber(v any) any {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case int:
		return float64(n)
	}
	return v
}

// TestInvalidModulesAreRejectedWithTheirMessage checks that each invalid manifest is rejected at
// admission with an error that names the field and says what is wrong, and that the controllers'
// own re-check of admission's rules (validation.Admission) finds the same field.
func TestInvalidModulesAreRejectedWithTheirMessage(t *testing.T) {
	manifests := readManifests(t, "invalid")
	if len(manifests) < 15 {
		t.Fatalf("want at least 15 invalid manifests, have %d", len(manifests))
	}
	ns := newNamespace(t)
	for _, m := range manifests {
		t.Run(m.name, func(t *testing.T) {
			if m.wantField == "" || m.wantMsg == "" {
				t.Fatal("manifest lacks its '# field:' or '# want:' header")
			}
			obj := m.obj.DeepCopy()
			obj.SetNamespace(ns)
			err := k8s.Create(context.Background(), obj)
			assertRejected(t, err, m.wantField, m.wantMsg)
			if m.clean && strings.Contains(err.Error(), "some validation rules were not checked") {
				t.Fatalf("the rejection carries the API server's noise about unchecked rules: %v", err)
			}

			typed := &kmmv1beta1.Module{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, typed); err != nil {
				t.Fatalf("decoding: %v", err)
			}
			assertFieldError(t, validation.Admission(typed), m.wantField)
		})
	}
}

func assertRejected(t *testing.T, err error, wantField, wantMsg string) {
	t.Helper()
	if err == nil {
		t.Fatal("accepted, want a rejection")
	}
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		t.Fatalf("rejected with %v, want an Invalid error", err)
	}
	t.Logf("rejected: %v", err)
	if !strings.Contains(err.Error(), wantField) || !strings.Contains(err.Error(), wantMsg) {
		t.Fatalf("rejection\n  %v\nwant it to name %q and say %q", err, wantField, wantMsg)
	}
}

func assertFieldError(t *testing.T, errs field.ErrorList, wantField string) {
	t.Helper()
	agg := errs.ToAggregate()
	if agg == nil || !strings.Contains(agg.Error(), wantField) {
		t.Fatalf("validation.Admission() = %v, want an error on %s", agg, wantField)
	}
}

// TestVersionCannotBeAddedOrRemoved checks the update rule: version unset→set and set→unset are
// both rejected, while changing a set version (an ordered upgrade) is allowed.
func TestVersionCannotBeAddedOrRemoved(t *testing.T) {
	ns := newNamespace(t)
	newModule := func(name, version string) *kmmv1beta1.Module {
		return &kmmv1beta1.Module{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: kmmv1beta1.ModuleSpec{
				Selector: map[string]string{"kmm": "yes"},
				ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
					Version:        version,
					Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmod"},
					KernelMappings: []kmmv1beta1.KernelMapping{{Regexp: "^.+$", ContainerImage: "reg.example.com/kmod:" + "$KERNEL_XYZ"}},
				}},
			},
		}
	}
	cases := []struct {
		name, from, to string
		newImage       bool
		wantMsg        string
	}{
		{name: "unset to set", from: "", to: "v1", wantMsg: "version cannot be added to or removed from an existing Module"},
		{name: "set to unset", from: "v1", to: "", wantMsg: "version cannot be added to or removed from an existing Module"},
		{name: "v1 to v2 is an upgrade", from: "v1", to: "v2", newImage: true},
		{name: "v1 to v2 without a new image", from: "v1", to: "v2", wantMsg: "the version changed but no kmod image did"},
		{name: "a new image without a new version", from: "v1", to: "v1", newImage: true, wantMsg: "a kmod image changed but the version did not"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			m := newModule(fmt.Sprintf("version-%d", i), tc.from)
			if err := k8s.Create(ctx, m); err != nil {
				t.Fatalf("create: %v", err)
			}
			old := m.DeepCopy()
			m.Spec.ModuleLoader.Container.Version = tc.to
			if tc.newImage {
				m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = "reg.example.com/kmod2:$KERNEL_XYZ"
			}
			err := k8s.Update(ctx, m)
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("update rejected: %v", err)
				}
				return
			}
			assertRejected(t, err, "spec.moduleLoader.container.version", tc.wantMsg)
			assertFieldError(t, validation.ModuleUpdate(m, old), "spec.moduleLoader.container.version")
		})
	}
}

// TestNodeModulesConfigRoundTrip checks that the internal NMC kind stores its FSM fields.
func TestNodeModulesConfigRoundTrip(t *testing.T) {
	ctx := context.Background()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cfg := kmmv1beta1.ModuleConfig{
		KernelVersion:  "6.1.0-56-cloud-amd64",
		ContainerImage: "reg.example.com/kmod:6.1.0",
		Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmod", DirName: "/opt"},
	}
	nmc := &kmmv1beta1.NodeModulesConfig{
		ObjectMeta: metav1.ObjectMeta{Name: "node-roundtrip"},
		Spec: kmmv1beta1.NodeModulesConfigSpec{Modules: []kmmv1beta1.NodeModuleSpec{
			{Namespace: "a", Name: "m", Config: cfg},
			{Namespace: "b", Name: "m", Config: cfg},
		}},
	}
	if err := k8s.Create(ctx, nmc); err != nil {
		t.Fatal(err)
	}
	nmc.Status.Modules = []kmmv1beta1.NodeModuleStatus{{
		Namespace: "a", Name: "m", Config: &cfg, State: kmmv1beta1.StateLoaded, Reason: "WorkerSucceeded",
		Attempts: 2, LastTransitionTime: now, LastWorkerTime: &now, BootID: "boot-1", ImageDigest: "sha256:abc",
		Transitions: []kmmv1beta1.Transition{
			{Trigger: "SpecSet", From: kmmv1beta1.StateAbsent, To: kmmv1beta1.StateLoading, Time: now},
			{Trigger: "WorkerSucceeded", From: kmmv1beta1.StateLoading, To: kmmv1beta1.StateLoaded, Time: now},
		},
	}}
	if err := k8s.Status().Update(ctx, nmc); err != nil {
		t.Fatal(err)
	}
	got := &kmmv1beta1.NodeModulesConfig{}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(nmc), got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Spec, nmc.Spec) || !reflect.DeepEqual(got.Status, nmc.Status) {
		t.Fatalf("read back\n%+v\nwant\n%+v", got, nmc)
	}

	bad := got.DeepCopy()
	bad.Status.Modules[0].State = "Dancing"
	err := k8s.Status().Update(ctx, bad)
	assertRejected(t, err, "status.modules[0].state", "Unsupported value")
}
