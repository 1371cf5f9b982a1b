package install_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/agent"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/poll"
)

const (
	helmNamespace = "kmm-helm" // not kmm-system: the chart follows the release namespace
	helmRelease   = "kmm"
	helmModules   = "helm-test"
	helmNode      = "helm-node"
	helmKernel    = "6.1.0-helm"
)

// helmSelector labels the test's node and selects it in its Modules, and no other test's.
var helmSelector = map[string]string{"kmm-helm-test": "yes"}

// kmmCRDs are the CRDs the chart installs; helm uninstall leaves them.
var kmmCRDs = []string{
	"modules.kmm.sigs.x-k8s.io", "nodemodulesconfigs.kmm.sigs.x-k8s.io",
	"moduleimagesconfigs.kmm.sigs.x-k8s.io", "preflightvalidations.kmm.sigs.x-k8s.io",
}

// TestChartInstallUpgradeUninstall installs the chart of the previous chart version (from git) with
// the Helm Go SDK into the test control plane, webhook on, certificates self-managed, runs the
// operator from the release's Deployment and has a Module load on a node (the simulated kubelet);
// upgrades the release to the current chart and rolls the operator over to the new Deployment,
// after which the node has seen no worker pod and no label of the loaded Module removed;
// uninstalls it with the Module still there: helm does not refuse (docs/install.md), the CRDs and
// the Module stay and the module stays loaded; the documented way out (reinstall, delete the
// Modules, uninstall) unloads it.
func TestChartInstallUpgradeUninstall(t *testing.T) {
	ctx := context.Background()
	root, _ := tools(t)
	admin := newClient(t, env.Config)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	setLogger(t)
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	helmLog, err := os.Create(filepath.Join(t.TempDir(), "helm.log"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := install.NewHelm(kubeconfig, helmNamespace, helmLog)
	if err != nil {
		t.Fatal(err)
	}
	current, _ := loadChart(t)
	commit, err := install.PreviousChartCommit(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	prevDir, err := install.ChartAt(ctx, root, commit, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	previous, err := install.LoadChart(prevDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("upgrading from the chart of %s", commit[:12])

	ag, err := agent.New(env.Config, agent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, stopAgent := context.WithCancel(ctx)
	t.Cleanup(stopAgent)
	go func() { _ = ag.Start(agentCtx) }()
	if err := ag.AddNode(ctx, helmNode, helmKernel, helmSelector); err != nil {
		t.Fatal(err)
	}
	// The node goes with the test: TestInstall's Modules must find no node without a kubelet.
	t.Cleanup(func() { _ = ag.RemoveNode(context.Background(), helmNode) })

	var op *replica
	t.Cleanup(func() {
		if op != nil {
			op.stop()
		}
	})
	// rollout replaces the operator by one running the release's Deployment, as the Deployment's
	// rolling update does (the pod's address stays: the test has one pod IP per replica).
	rollout := func(t *testing.T, rel *releasev1.Release) {
		t.Helper()
		objs, err := install.Decode([]byte(rel.Manifest))
		if err != nil {
			t.Fatal(err)
		}
		args, err := install.ContainerArgs(install.Find(objs, "Deployment", deploymentName), "manager")
		if err != nil {
			t.Fatal(err)
		}
		port := webhookContainerPort(t, objs)
		if op != nil {
			op.stop()
			publishIn(t, admin, helmNamespace, port)
		}
		op = startReplica(t, serviceAccountConfig(t, cs, helmNamespace, "kmm-controller-manager"), args, "192.0.2.9", port)
		op.waitReady(t)
		publishIn(t, admin, helmNamespace, port, op)
	}
	modA := helmModule("a")
	var runsA int
	revokeCurrent := func() {}

	step("helm install (the previous chart): the webhook answers and a Module loads", func(t *testing.T) {
		rel, err := h.Install(ctx, previous, helmRelease, nil, kube.HookOnlyStrategy, time.Minute)
		if err != nil {
			t.Fatalf("helm install: %v", err)
		}
		revokeCurrent = grantCurrentRules(t, admin, root)
		rollout(t, rel)
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmModules}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		assertRejected(t, admin.Create(ctx, helmModuleWith("bad", invalidRegexp)))
		if err := admin.Create(ctx, modA); err != nil {
			t.Fatal(err)
		}
		waitLabel(t, admin, modA, true)
		runsA = ag.RunCount(helmNode, helmModules+"/a")
		if runsA == 0 {
			t.Fatal("the Module is loaded without a worker run")
		}
	})

	step("helm upgrade to the current chart changes nothing on the node", func(t *testing.T) {
		labels := watchLabelRemovals(t, cs, kmmv1beta1.ReadyLabel(helmModules, "a"))
		rel, err := h.Upgrade(ctx, current, helmRelease, nil, kube.HookOnlyStrategy, time.Minute)
		if err != nil {
			t.Fatalf("helm upgrade: %v", err)
		}
		if rel.Version != 2 {
			t.Errorf("release version %d after the upgrade, want 2", rel.Version)
		}
		revokeCurrent() // the current chart's own role must be enough now
		rollout(t, rel)
		assertDeploymentIs(t, admin, rel)
		// Barrier: a second Module loads, so the new operator has reconciled the node's
		// NodeModulesConfig, which holds the first Module's entry too.
		modB := helmModule("b")
		if err := admin.Create(ctx, modB); err != nil {
			t.Fatal(err)
		}
		waitLabel(t, admin, modB, true)
		if got := ag.RunCount(helmNode, helmModules+"/a"); got != runsA {
			t.Errorf("the upgrade ran %d worker pods for the loaded Module", got-runsA)
		}
		if removed := labels(); len(removed) > 0 {
			t.Errorf("the upgrade removed the loaded Module's label from the node: %v", removed)
		}
	})

	step("helm uninstall with Modules left: not refused; the CRDs, the Modules and the loaded modules stay", func(t *testing.T) {
		labels := watchLabelRemovals(t, cs, kmmv1beta1.ReadyLabel(helmModules, "a"))
		if err := h.Uninstall(helmRelease, time.Minute); err != nil {
			t.Fatalf("helm uninstall: %v", err)
		}
		op.stop() // the Deployment is gone: so is the operator's pod
		op = nil
		for _, name := range kmmCRDs {
			if err := admin.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{}); err != nil {
				t.Errorf("CRD %s after helm uninstall: %v", name, err)
			}
		}
		for _, gone := range []client.Object{
			&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: helmNamespace, Name: deploymentName}},
			&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: webhookName}},
		} {
			if err := admin.Get(ctx, client.ObjectKeyFromObject(gone), gone); !apierrors.IsNotFound(err) {
				t.Errorf("%T %s after helm uninstall: %v, want it gone", gone, gone.GetName(), err)
			}
		}
		m := &kmmv1beta1.Module{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(modA), m); err != nil || !slices.Contains(m.Finalizers, "kmm.sigs.x-k8s.io/unload") {
			t.Errorf("the Module after helm uninstall: %v, finalizers %v; want it there with its finalizer", err, m.Finalizers)
		}
		if removed := labels(); len(removed) > 0 {
			t.Errorf("helm uninstall removed the loaded Module's label: %v", removed)
		}
		if _, loaded := ag.Loaded(helmNode)[helmModules+"/a"]; !loaded {
			t.Errorf("the module is no longer loaded on the node (loaded: %v)", ag.Loaded(helmNode))
		}
	})

	step("the way out: reinstall, delete the Modules (unloaded), uninstall", func(t *testing.T) {
		rel, err := h.Install(ctx, current, helmRelease, nil, kube.HookOnlyStrategy, time.Minute)
		if err != nil {
			t.Fatalf("helm install over the kept CRDs: %v", err)
		}
		rollout(t, rel)
		for _, name := range []string{"a", "b"} {
			if err := admin.Delete(ctx, helmModule(name)); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"a", "b"} {
			m := helmModule(name)
			poll.Until(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) {
				return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKeyFromObject(m), &kmmv1beta1.Module{})), "Module " + name + " to be gone"
			})
			waitLabel(t, admin, m, false)
		}
		if loaded := ag.Loaded(helmNode); len(loaded) != 0 {
			t.Errorf("loaded on the node after the Modules' deletion: %v", loaded)
		}
		if err := h.Uninstall(helmRelease, time.Minute); err != nil {
			t.Fatal(err)
		}
		op.stop()
		op = nil
		// What helm left, the CRDs, removed as docs/install.md says: the next test starts from a
		// control plane without kmm. The wait is kube-apiserver's CRD finalizer's bound and some,
		// as in TestInstall.
		for _, name := range kmmCRDs {
			err := admin.Delete(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}})
			if err != nil {
				t.Fatal(err)
			}
		}
		poll.Until(t, 90*time.Second, 100*time.Millisecond, func() (bool, string) {
			for _, name := range kmmCRDs {
				crd := &apiextensionsv1.CustomResourceDefinition{}
				if err := admin.Get(ctx, client.ObjectKey{Name: name}, crd); !apierrors.IsNotFound(err) {
					return false, fmt.Sprintf("CRD %s to be gone (%v; conditions %v)", name, err, crd.Status.Conditions)
				}
			}
			return true, ""
		})
	})
}

func helmModule(name string) *kmmv1beta1.Module {
	return helmModuleWith(name, `^6\.1\..*$`)
}

func helmModuleWith(name, regexp string) *kmmv1beta1.Module {
	m := module(name, regexp)
	m.Namespace = helmModules
	m.Spec.Selector = helmSelector
	m.Spec.ModuleLoader.Container.Modprobe.ModuleName = "kmod_" + name
	return m
}

// waitLabel waits until the Module's ready label is on the node (loaded) or not.
func waitLabel(t *testing.T, c client.Client, m *kmmv1beta1.Module, loaded bool) {
	t.Helper()
	label := kmmv1beta1.ReadyLabel(m.Namespace, m.Name)
	poll.Until(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) {
		n := &corev1.Node{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: helmNode}, n); err != nil {
			return false, err.Error()
		}
		_, has := n.Labels[label]
		return has == loaded, fmt.Sprintf("label %s on %s: %v", label, helmNode, loaded)
	})
}

// watchLabelRemovals watches the node until the returned function is called, which returns each
// moment the label was missing.
func watchLabelRemovals(t *testing.T, cs kubernetes.Interface, label string) func() []string {
	t.Helper()
	w, err := cs.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", helmNode).String()})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var removed []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			if _, has := n.Labels[label]; !has || ev.Type == watch.Deleted {
				mu.Lock()
				removed = append(removed, fmt.Sprintf("%s at resourceVersion %s", ev.Type, n.ResourceVersion))
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return removed
	}
}

// assertDeploymentIs checks that the cluster's Deployment runs the release's arguments.
func assertDeploymentIs(t *testing.T, c client.Client, rel *releasev1.Release) {
	t.Helper()
	objs, err := install.Decode([]byte(rel.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	want, err := install.ContainerArgs(install.Find(objs, "Deployment", deploymentName), "manager")
	if err != nil {
		t.Fatal(err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("Deployment"))
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: helmNamespace, Name: deploymentName}, got); err != nil {
		t.Fatal(err)
	}
	have, err := install.ContainerArgs(got, "manager")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(want, have) {
		t.Errorf("the cluster's Deployment runs %q, the release %q", have, want)
	}
}

// grantCurrentRules binds the current manager ClusterRole's rules (config/rbac/role.yaml,
// controller-gen's output) to the release's ServiceAccount, and returns what removes them. The
// operator the test runs under the previous chart is this commit's code, not the previous
// commit's image: when this commit's operator needs a permission the previous chart did not grant
// (a new controller's watch), it would fail for a reason an upgrade never meets, since the previous
// image did not need it. The binding goes before the upgrade, so the current chart's own RBAC is
// what the upgraded operator runs with.
func grantCurrentRules(t *testing.T, admin client.Client, root string) func() {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	u := install.Find(objs, "ClusterRole", "kmm-manager-role")
	if u == nil {
		t.Fatal("config/rbac/role.yaml has no ClusterRole kmm-manager-role")
	}
	role := &rbacv1.ClusterRole{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, role); err != nil {
		t.Fatal(err)
	}
	const name = "kmm-helm-test-current-rules"
	role.ObjectMeta = metav1.ObjectMeta{Name: name}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: helmNamespace, Name: "kmm-controller-manager"}},
	}
	ctx := context.Background()
	for _, o := range []client.Object{role, binding} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	revoke := func() {
		for _, o := range []client.Object{binding, role} {
			if err := admin.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("removing %s: %v", name, err)
			}
		}
	}
	t.Cleanup(revoke)
	return revoke
}
