//go:build e2e

package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/e2e"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/kmodimage"
	"github.com/kmm-project/kmm/test/poll"
)

// The Modules of TestKMM, all in one namespace, all selecting the node.
const (
	kmmNamespace = "e2e-kmm"
	// modKmod has a device plugin and goes through the ordered upgrade v1 → v2.
	modKmod = "kmod"
	// modRestart loads while the operator pod is deleted.
	modRestart = "restart"
	// modLate's image is pushed only after its worker failed to pull it.
	modLate = "late"
	// operatorNamespace is config/default's.
	operatorNamespace = "kmm-system"
)

// kernelModules are the kernel module names in the kmod images, per Module.
var kernelModules = map[string]string{modKmod: "kmm_e2e", modRestart: "kmm_e2e_restart", modLate: "kmm_e2e_late", modDRA: "kmm_e2e_dra", modVendor: "kmm_e2e_gpu",
	modHooked: "kmm_e2e_late"}

// waitStep bounds each wait of TestKMM; the slowest (a back-off, the operator's restart with its
// leader election) take 20-30 s.
const waitStep = 2 * time.Minute

// kmmEnv is kmm installed on the cluster, as TestKMM's scenarios use it.
type kmmEnv struct {
	c          *e2e.Cluster
	cl         client.Client
	cs         kubernetes.Interface
	node       string
	kernel     string
	bootID     string
	managerRef string
	workerRef  string
	// kmodImages are the kmod images by Module and version, built but not necessarily pushed.
	kmodImages map[string]kmodimageRef
	kubectlKMM string
	sandbox    string
	pods       *podRecorder
	// watchCtx and watchWG bound the test's watches.
	watchCtx context.Context
	watchWG  *sync.WaitGroup
	// img is what the build and sign steps share (imagebuild_test.go).
	img *imageEnv
}

// kmodimageRef is a kmod image and where a Module names it.
type kmodimageRef struct {
	push func() error // pushes it to the registry
	ref  string       // for the Module: at the node IP, as the worker pod pulls it
}

// TestKMM runs kmm itself on the real node: its own images from `make images` (linux on this
// machine's architecture only, to save the arm64 build), installed from config/ through
// test/e2e/overlay (webhook on, self-managed certificate), the operator a Deployment pod on the
// node, the worker pods from the worker image. This host's kernel cannot load modules, so the
// operator runs with --worker-dry-run-sandbox: every worker pod is the real one from the real
// image, but runs `modprobe -n` against a sandbox folder, as `make demo` runs the worker. Everything
// goes through the API as a user would; pods are observed from a watch.
func TestKMM(t *testing.T) {
	c := cluster(t)
	c.WaitNodeReady(t, 2*time.Minute)
	k := setUpKMM(t, c)

	steps := []struct {
		name string
		run  func(*testing.T, *kmmEnv)
	}{
		{"the webhook rejects an invalid Module, naming the field", testInvalidModule},
		{"Modules with build and sign created; the operator builds, signs and loads while the next steps run", testImageModulesCreated},
		{"a Module with a device plugin loads on the node", testLoad},
		{"ordered upgrade v1 to v2 by the version label", testOrderedUpgrade},
		{"the operator pod deleted during a load: the new one resumes", testOperatorRestart},
		{"a worker that cannot pull backs off, then recovers when the image is pushed", testBackOff},
		{"build and sign through the operator: BuildKit pod, sign pod, the signed image loaded", testBuildAndSign},
		{"a failing Dockerfile: ImageFailing with the step's output, one Event per failure", testBrokenDockerfile},
		{"a GPU vendor's Module with its image present loads with no build or sign pod", testVendorModule},
		{"the Modules with build and sign deleted", testImageModulesDeleted},
		{"kubectl kmm status and history", testKubectlKMM},
		{"a Module with a DRA driver: driver Ready, DeviceClass, dra-ready; ordered upgrade held by an allocated claim", testDRA},
		{"Modules deleted: unloaded, device plugin, DRA driver, DeviceClass, labels and NMC gone, finalizers released", testDelete},
		{"hooks and validation on the real kubelet: worker then postLoad hook, validation pod, preUnload hook then unload worker", testHooksAndValidation},
		{"installed with the Helm chart instead: a Module loads and unloads, helm uninstall", testChart},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, k) }) {
			t.FailNow() // each step starts from the state the one before left
		}
	}
	if p := k.pods.problems(); len(p) > 0 {
		t.Errorf("seen from the pod watch:\n%s", strings.Join(p, "\n"))
	}
}

// setUpKMM builds and pushes the images, builds kubectl-kmm, installs kmm and waits for its webhook.
func setUpKMM(t *testing.T, c *e2e.Cluster) *kmmEnv {
	ctx := context.Background()
	scheme := install.Scheme(app.NewScheme())
	cl, err := c.Client(scheme)
	if err != nil {
		t.Fatal(err)
	}
	node, err := c.Clientset().CoreV1().Nodes().Get(ctx, c.NodeName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k := &kmmEnv{
		c: c, cl: cl, cs: c.Clientset(), node: c.NodeName(),
		kernel: node.Status.NodeInfo.KernelVersion, bootID: node.Status.NodeInfo.BootID,
		kubectlKMM: filepath.Join(shared.root, "bin", "kubectl-kmm"),
		sandbox:    filepath.Join(c.Dir, "sandbox"),
	}
	if k.kernel == "" || k.bootID == "" {
		t.Fatalf("node %s reports kernel %q and boot ID %q", k.node, k.kernel, k.bootID)
	}

	// make images (the slow part) beside the kmod images, kubectl-kmm, and what the builds need
	// (kmm-builder, the base image of Debian gcc and kernel headers).
	start := time.Now()
	err = parallel(
		func() error { return makeImages(filepath.Join(c.LogDir(), "make-images.log")) },
		func() error { return goBuild(k.kubectlKMM, "./cmd/kubectl-kmm") },
		func() error { return k.buildKmodImages() },
		k.prepareBuild,
	)
	if err != nil {
		t.Fatal(err)
	}
	tm.add("images: make images (linux/"+runtime.GOARCH+"), 7 kmod images, kubectl-kmm; kmm-builder and the build base image assembled and pushed", start)
	start = time.Now()
	if k.managerRef, err = c.PushLayout("kmm/kmm-manager:e2e", filepath.Join(shared.root, "bin", "images", "kmm-manager")); err != nil {
		t.Fatal(err)
	}
	if k.workerRef, err = c.PushLayout("kmm/kmm-worker:e2e", filepath.Join(shared.root, "bin", "images", "kmm-worker")); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{modKmod + "-v1", modKmod + "-v2", modRestart, modDRA + "-v1", modDRA + "-v2", modVendor} {
		if err := k.kmodImages[m].push(); err != nil {
			t.Fatal(err)
		}
	}
	tm.add("images pushed (kmm-manager, kmm-worker, 6 of the 7 kmod images)", start)

	if _, err := k.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kmmNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	watchCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	k.watchCtx, k.watchWG = watchCtx, &wg
	if k.pods, err = recordPods(watchCtx, k.cs, kmmNamespace, &wg); err != nil {
		t.Fatal(err)
	}
	if err := followOperatorLogs(watchCtx, k.cs, c.LogDir(), &wg); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	k.install(t)
	k.waitWebhook(t)
	tm.add("install from config/ (overlay test/e2e/overlay) → operator Ready, webhook answering", start)
	return k
}

// makeImages runs `make images` for this machine's platform only: the e2e node runs nothing else,
// and cross-compiling the operator for arm64 would double the build.
func makeImages(logFile string) error {
	log, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command("make", "-C", shared.root, "images", "IMAGE_PLATFORMS=linux/"+runtime.GOARCH)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("make images: %w (see %s)", err, logFile)
	}
	return nil
}

// goBuild builds a main package of the module into out.
func goBuild(out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = shared.root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// buildKmodImages builds the kmod images (FROM scratch: real ELF .ko files for the node's kernel
// and depmod's output, test/kmodimage) and records how to push each.
func (k *kmmEnv) buildKmodImages() error {
	tools, err := kmodimage.FindTools()
	if err != nil {
		return err
	}
	k.kmodImages = map[string]kmodimageRef{}
	for _, im := range []struct{ key, module, version string }{
		{modKmod + "-v1", modKmod, "v1"}, {modKmod + "-v2", modKmod, "v2"}, {modRestart, modRestart, "v1"}, {modLate, modLate, "v1"},
		{modDRA + "-v1", modDRA, "v1"}, {modDRA + "-v2", modDRA, "v2"}, {modVendor, modVendor, "v1"},
	} {
		img, err := kmodimage.Build(tools, kmodimage.Spec{Kernel: k.kernel, Module: kernelModules[im.module], Version: im.version})
		if err != nil {
			return fmt.Errorf("building the kmod image %s: %w", im.key, err)
		}
		repo := "kmm-e2e/" + im.key
		registry := k.c.NodeRegistryAddr()
		if im.module == modRestart {
			// Through the mirror containerd's hosts.toml names: the worker reads it too.
			registry = e2e.MirroredRegistry
		}
		k.kmodImages[im.key] = kmodimageRef{
			// The Module names it with $KERNEL_FULL_VERSION, as a user would.
			ref: registry + "/" + repo + ":$KERNEL_FULL_VERSION",
			push: func() error {
				_, err := k.c.PushImage(repo+":"+k.kernel, img)
				return err
			},
		}
	}
	return nil
}

// install renders test/e2e/overlay with the values of this run on top (the images, the API
// server's port, the sandbox folder) and applies it as `make deploy` does (test/install).
func (k *kmmEnv) install(t *testing.T) {
	installKMM(t, k.c, k.cl, "overlay", []string{"kmm-manager=" + k.managerRef, "kmm-worker=" + k.workerRef, "kmm-builder=" + k.img.builderRef}, map[string]string{
		"KMM_E2E_SANDBOX": k.sandbox, "KMM_E2E_CONTAINERD_CONFIG_PATH": k.c.ContainerdConfigPath(),
	})
}

// installKMM renders the overlay test/e2e/<overlay> with the images (kustomize's name=reference),
// the API server's port and env on top, and applies it as `make deploy` does (test/install);
// install.log is its output.
func installKMM(t *testing.T, c *e2e.Cluster, cl client.Client, overlay string, images []string, env map[string]string) {
	ctx := context.Background()
	kustomize, err := install.Kustomize(shared.root)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := install.Overlay(ctx, kustomize, filepath.Join(shared.root, "test", "e2e", overlay), t.TempDir(), images)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.HostNetworkEnv() {
		if e.Name == "KUBERNETES_SERVICE_PORT" {
			env[e.Name] = e.Value
		}
	}
	patch := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: kmm-controller-manager
  namespace: %s
spec:
  template:
    spec:
      containers:
        - name: manager
          env:
`, operatorNamespace)
	for _, name := range slices.Sorted(maps.Keys(env)) {
		patch += fmt.Sprintf("            - name: %s\n              value: %q\n", name, env[name])
	}
	if err := os.WriteFile(filepath.Join(dir, "run.yaml"), []byte(patch), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "kustomization.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("patches:\n  - path: run.yaml\n")
	if err := errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
	objs, err := install.Render(ctx, kustomize, dir)
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(c.LogDir(), "install.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	if err := install.Apply(ctx, cl, objs, false, log); err != nil {
		t.Fatal(err)
	}
}

// invalidModule has a kernel mapping whose regexp does not compile: the CRD schema cannot check
// that, the webhook does.
func (k *kmmEnv) invalidModule() *kmmv1beta1.Module {
	m := k.module(modKmod, "", k.kmodImages[modKmod+"-v1"].ref, false)
	m.Name = "invalid"
	m.Spec.ModuleLoader.Container.KernelMappings = []kmmv1beta1.KernelMapping{{Regexp: "("}}
	return m
}

// waitWebhook waits until the operator pod is Ready and the API server gets an answer from the
// webhook (a dry-run create of an invalid Module is denied by it, not refused for want of it).
func (k *kmmEnv) waitWebhook(t *testing.T) {
	poll.Until(t, 3*time.Minute, 500*time.Millisecond, func() (bool, string) {
		err := k.cl.Create(context.Background(), k.invalidModule(), client.DryRunAll)
		if err == nil {
			t.Fatal("an invalid Module was accepted (dry run)")
		}
		return strings.Contains(err.Error(), "denied the request"), "creating an invalid Module (dry run): " + err.Error() + "; operator: " + k.operatorPodState()
	})
}

// operatorPodState describes the operator pods, for failure messages.
func (k *kmmEnv) operatorPodState() string {
	pods, err := k.cs.CoreV1().Pods(operatorNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err != nil {
		return err.Error()
	}
	var out []string
	for i := range pods.Items {
		p := &pods.Items[i]
		out = append(out, fmt.Sprintf("%s %s%s", p.Name, p.Status.Phase, describe(p)))
	}
	return fmt.Sprintf("%d pods %v", len(out), out)
}

// module is a Module of kmmNamespace selecting the node, loading kernelModules[name] from image
// (plain HTTP: the registry at the node IP), with a device plugin (the pause image) when asked.
func (k *kmmEnv) module(name, version, image string, devicePlugin bool) *kmmv1beta1.Module {
	m := &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: kmmNamespace, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{corev1.LabelHostname: k.node},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Version:        version,
				ContainerImage: image,
				RegistryTLS:    kmmv1beta1.TLSOptions{Insecure: true},
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: kernelModules[name]},
				KernelMappings: []kmmv1beta1.KernelMapping{{Literal: k.kernel}},
			}},
		},
	}
	if devicePlugin {
		m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: k.c.PauseImage()}}
	}
	return m
}

func testInvalidModule(t *testing.T, k *kmmEnv) {
	err := k.cl.Create(context.Background(), k.invalidModule())
	const field = "spec.moduleLoader.container.kernelMappings[0].regexp"
	switch {
	case err == nil:
		t.Fatal("an invalid Module was created")
	case !strings.Contains(err.Error(), "admission webhook") || !strings.Contains(err.Error(), "denied the request"):
		t.Errorf("refused, but not by the webhook: %v", err)
	case !strings.Contains(err.Error(), field):
		t.Errorf("the webhook's refusal does not name %s: %v", field, err)
	}
	t.Logf("refused: %v", err)
}

func testLoad(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	k.setNodeLabel(t, kmmv1beta1.ModuleVersionLabel(kmmNamespace, modKmod), "v1")
	start := time.Now()
	if err := k.cl.Create(ctx, k.module(modKmod, "v1", k.kmodImages[modKmod+"-v1"].ref, true)); err != nil {
		t.Fatal(err)
	}
	st := k.waitLoaded(t, modKmod, "v1")
	tm.add("load: Module created → NMC status Loaded", start)
	k.waitDevicePlugin(t, modKmod, "v1")
	tm.add("load: Module created → device plugin pod Ready", start)

	if st.BootID != k.bootID {
		t.Errorf("the status records boot ID %q, the node's is %q", st.BootID, k.bootID)
	}
	// The device-plugin-ready label follows the device plugin pod's Ready condition: the NMC
	// controller sets it on the reconcile that pod event causes, a moment after the pod is Ready.
	poll.Until(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		labels := k.nodeLabels(t)
		for key, want := range map[string]string{
			kmmv1beta1.ReadyLabel(kmmNamespace, modKmod):             "",
			kmmv1beta1.VersionReadyLabel(kmmNamespace, modKmod):      "v1",
			kmmv1beta1.DevicePluginReadyLabel(kmmNamespace, modKmod): "",
		} {
			if got, ok := labels[key]; !ok || got != want {
				return false, fmt.Sprintf("node label %s = %q (set %v), want %q", key, got, ok, want)
			}
		}
		return true, ""
	})
	k.waitNoWorkerPod(t, modKmod)

	// The worker pod, as the watch saw it: the worker image, in dry-run mode, Succeeded with the
	// worker's result as its termination message.
	runs := k.pods.workerRuns(modKmod)
	if len(runs) != 1 || runs[0].action != "load" {
		t.Fatalf("worker pods of %s: %v, want one load", modKmod, runs)
	}
	run := runs[0]
	ctr := run.last.Spec.Containers[0]
	if ctr.Image != k.workerRef || !slices.Contains(ctr.Args, "--dry-run") {
		t.Errorf("worker pod runs %s %q, want the worker image %s in dry-run mode", ctr.Image, ctr.Args, k.workerRef)
	}
	if run.last.Status.Phase != corev1.PodSucceeded || !run.deleted {
		t.Errorf("worker pod last seen %s (deleted %v), want Succeeded and then deleted", run.last.Status.Phase, run.deleted)
	}
	res := terminationResult(t, run.last)
	if res.Outcome != contract.OutcomeSucceeded || res.Action != contract.ActionLoad || res.BootID != k.bootID ||
		res.KernelModule != kernelModules[modKmod] || res.Kernel != k.kernel || !strings.HasPrefix(res.ImageDigest, "sha256:") {
		t.Errorf("the worker's result %+v: want a successful load of %s for kernel %s on boot %s, with the image digest", res, kernelModules[modKmod], k.kernel, k.bootID)
	}
	// The worker pod pulled the kmod image into its cache, a host path (in the sandbox).
	if entries, err := os.ReadDir(filepath.Join(k.sandbox, "var", "lib", "kmm", "cache")); err != nil || len(entries) == 0 {
		t.Errorf("the worker left no image cache in the sandbox on the host: %v, %v", entries, err)
	}
}

func testOrderedUpgrade(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	mark := k.pods.mark()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &kmmv1beta1.Module{}
		if err := k.cl.Get(ctx, client.ObjectKey{Namespace: kmmNamespace, Name: modKmod}, m); err != nil {
			return err
		}
		m.Spec.ModuleLoader.Container.Version = "v2"
		m.Spec.ModuleLoader.Container.ContainerImage = k.kmodImages[modKmod+"-v2"].ref
		return k.cl.Update(ctx, m)
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	k.setNodeLabel(t, kmmv1beta1.ModuleVersionLabel(kmmNamespace, modKmod), "v2")
	st := k.waitLoaded(t, modKmod, "v2")
	k.waitDevicePlugin(t, modKmod, "v2")
	tm.add("upgrade: version label v2 → v2 Loaded, its device plugin pod Ready", start)
	k.waitNoWorkerPod(t, modKmod)
	if got := k.nodeLabels(t)[kmmv1beta1.VersionReadyLabel(kmmNamespace, modKmod)]; got != "v2" {
		t.Errorf("version.ready label %q, want v2", got)
	}

	// From the watch, in the order the API server wrote them: the v1 device plugin pod deleted,
	// then the unload pod created; the v2 load pod created after the unload pod finished.
	events := k.pods.since(mark)
	dpV1Gone := indexOf(events, func(e podEvent) bool {
		return e.typ == "DELETED" && devicePluginVersion(e.pod, modKmod) == "v1"
	})
	unloadCreated := indexOf(events, func(e podEvent) bool {
		return e.typ == "ADDED" && isWorker(e.pod, modKmod) && e.pod.Labels[contract.LabelAction] == "unload"
	})
	unloadDone := indexOf(events, func(e podEvent) bool {
		return isWorker(e.pod, modKmod) && e.pod.Labels[contract.LabelAction] == "unload" && e.pod.Status.Phase == corev1.PodSucceeded
	})
	loadCreated := indexOf(events, func(e podEvent) bool {
		return e.typ == "ADDED" && isWorker(e.pod, modKmod) && e.pod.Labels[contract.LabelAction] == "load"
	})
	switch {
	case dpV1Gone < 0 || unloadCreated < 0 || unloadDone < 0 || loadCreated < 0:
		t.Errorf("events missing from the watch: v1 device plugin pod deleted at %d, unload pod created at %d, Succeeded at %d, v2 load pod created at %d\n%s",
			dpV1Gone, unloadCreated, unloadDone, loadCreated, describeEvents(events))
	case dpV1Gone > unloadCreated:
		t.Errorf("the unload pod was created (event %d) before the v1 device plugin pod was gone (event %d)\n%s", unloadCreated, dpV1Gone, describeEvents(events))
	case loadCreated < unloadDone:
		t.Errorf("the v2 load pod was created (event %d) before v1 was unloaded (event %d)\n%s", loadCreated, unloadDone, describeEvents(events))
	}
	var path []string
	for _, tr := range st.Transitions {
		path = append(path, string(tr.To))
	}
	for _, s := range []kmmv1beta1.ModuleState{kmmv1beta1.StateDevicePluginDraining, kmmv1beta1.StateUpgrading} {
		if !slices.Contains(path, string(s)) {
			t.Errorf("the pair's transitions %v do not pass through %s", path, s)
		}
	}
}

func testOperatorRestart(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	old := k.operatorPod(t)
	if err := k.cl.Create(ctx, k.module(modRestart, "", k.kmodImages[modRestart].ref, false)); err != nil {
		t.Fatal(err)
	}
	// Delete the operator pod as soon as the load's worker pod exists.
	poll.Until(t, waitStep, 50*time.Millisecond, func() (bool, string) {
		return len(k.pods.workerRuns(modRestart)) > 0, "no worker pod for " + modRestart + " yet"
	})
	if st := k.pair(t, modRestart); st != nil && st.State == kmmv1beta1.StateLoaded {
		t.Fatalf("%s was Loaded before the operator pod could be deleted", modRestart)
	}
	leader := k.leader(t)
	start := time.Now()
	if err := k.cs.CoreV1().Pods(operatorNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted the operator pod %s while the %s worker pod ran", old.Name, modRestart)
	var replacement *corev1.Pod
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		pods, err := k.cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
		if err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 || pods.Items[0].UID == old.UID || !podReady(&pods.Items[0]) {
			return false, "operator pods: " + k.operatorPodState()
		}
		replacement = &pods.Items[0]
		return true, ""
	})
	tm.add("operator pod deleted → new operator pod Ready", start)
	st := k.waitLoaded(t, modRestart, "")
	tm.add("operator pod deleted → the load it left Loaded", start)
	k.waitNoWorkerPod(t, modRestart)
	if !st.LastTransitionTime.After(start) {
		t.Errorf("%s Loaded at %s, before the old operator pod was deleted at %s", modRestart, st.LastTransitionTime, start)
	}
	// The new pod leads (a hostNetwork pod's hostname is the node's, so the identities differ by
	// their random suffix only).
	if now := k.leader(t); now == leader || now == "" {
		t.Errorf("the leader is %q, as before the operator pod %s was deleted; want the new pod %s", now, old.Name, replacement.Name)
	}
	if runs := k.pods.workerRuns(modRestart); len(runs) != 1 {
		t.Errorf("worker pods of %s: %v, want the one load pod the old operator started", modRestart, runs)
	}
	// Nothing left: the only pod in the Modules' namespace is the device plugin's.
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		for i := range pods {
			if devicePluginVersion(&pods[i], modKmod) == "" {
				return false, "left behind: " + pods[i].Name
			}
		}
		return true, ""
	})
}

func testBackOff(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	start := time.Now()
	if err := k.cl.Create(ctx, k.module(modLate, "", k.kmodImages[modLate].ref, false)); err != nil {
		t.Fatal(err)
	}
	var st *kmmv1beta1.NodeModuleStatus
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		st = k.pair(t, modLate)
		return st != nil && st.State == kmmv1beta1.StateLoadBackOff, describeStatus(st)
	})
	if st.Reason != string(contract.ReasonImagePull) || st.Attempts < 1 {
		t.Errorf("status %s, want the reason ImagePull and an attempt counted", describeStatus(st))
	}
	t.Logf("backing off: %s", describeStatus(st))
	var event string
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		evs, err := k.cs.EventsV1().Events(kmmNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Regarding.Kind != "Module" {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s %s/%s: %s", e.Type, e.Reason, e.Regarding.Kind, e.Regarding.Name, e.Note))
			// The Event of the failed worker run on the Module, its reason the failure class
			// (docs/troubleshooting.md, Events).
			if e.Type == corev1.EventTypeWarning && e.Reason == string(contract.ReasonImagePull) && e.Regarding.Kind == "Module" &&
				e.Regarding.Name == modLate && strings.Contains(e.Note, "-> "+string(kmmv1beta1.StateLoadBackOff)) {
				event = seen[len(seen)-1]
				return true, ""
			}
		}
		return false, fmt.Sprintf("no Warning Event ImagePull on Module %s for the move to LoadBackOff; Events: %v", modLate, seen)
	})
	t.Logf("Event: %s", event)
	t.Logf("$ kubectl kmm status %s/%s\n%s", kmmNamespace, modLate, k.kubectl(t, "status", kmmNamespace+"/"+modLate))
	tm.add("back-off: Module created → LoadBackOff (ImagePull) and its Event", start)

	start = time.Now()
	if err := k.kmodImages[modLate].push(); err != nil {
		t.Fatal(err)
	}
	k.waitLoaded(t, modLate, "")
	tm.add("back-off: image pushed → Loaded at the next attempt", start)
	k.waitNoWorkerPod(t, modLate)
	if runs := k.pods.workerRuns(modLate); len(runs) < 2 || runs[0].last.Status.Phase != corev1.PodFailed {
		t.Errorf("worker pods of %s: %v, want a failed one and then the one that loaded", modLate, runs)
	} else if res := terminationResult(t, runs[0].last); res.Reason != contract.ReasonImagePull {
		t.Errorf("the failed worker's result %+v, want reason ImagePull", res)
	}
}

func testKubectlKMM(t *testing.T, k *kmmEnv) {
	out := k.kubectl(t, "status")
	t.Logf("$ kubectl kmm status\n%s", out)
	for _, m := range []string{modKmod, modRestart, modLate} {
		if !strings.Contains(out, kmmNamespace+"/"+m) {
			t.Errorf("kubectl kmm status shows no row for %s", m)
		}
	}
	var list struct { // a kubectl List of rows
		Items []struct {
			Node, Module, State, Kernel, LoadedImage string
		}
	}
	if err := json.Unmarshal([]byte(k.kubectl(t, "status", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	rows := list.Items
	if len(rows) != 3 {
		t.Errorf("kubectl kmm status -o json: %d rows, want 3: %+v", len(rows), rows)
	}
	for _, r := range rows {
		if r.Node != k.node || r.State != string(kmmv1beta1.StateLoaded) || r.Kernel != k.kernel {
			t.Errorf("kubectl kmm status -o json row %+v: want Loaded on %s for %s", r, k.node, k.kernel)
		}
	}
	out = k.kubectl(t, "history", k.node, kmmNamespace+"/"+modKmod)
	t.Logf("$ kubectl kmm history %s %s/%s\n%s", k.node, kmmNamespace, modKmod, out)
	var historyList struct {
		Items []struct{ From, To, Trigger string }
	}
	if err := json.Unmarshal([]byte(k.kubectl(t, "history", k.node, kmmNamespace+"/"+modKmod, "-o", "json")), &historyList); err != nil {
		t.Fatal(err)
	}
	history := historyList.Items
	var to []string
	for _, h := range history {
		to = append(to, h.To)
	}
	// Loaded twice (v1, then v2), through the upgrade's states.
	want := []string{"Loading", "Loaded", "DevicePluginDraining", "Upgrading", "Loaded"}
	if !isSubsequence(want, to) {
		t.Errorf("kubectl kmm history: states %v, want %v in that order", to, want)
	}
}

func testDelete(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	mark := k.pods.mark()
	start := time.Now()
	k.deleteDRAApp(t)
	for _, m := range []string{modKmod, modRestart, modLate, modDRA} {
		if err := k.cl.Delete(ctx, &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: kmmNamespace, Name: m}}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		list := &kmmv1beta1.ModuleList{}
		if err := k.cl.List(ctx, list, client.InNamespace(kmmNamespace)); err != nil {
			return false, err.Error()
		}
		var left []string
		for _, m := range list.Items {
			left = append(left, fmt.Sprintf("%s (finalizers %v)", m.Name, m.Finalizers))
		}
		return len(left) == 0, fmt.Sprintf("Modules left: %v", left)
	})
	tm.add("delete: Modules deleted → unloaded, finalizers released", start)
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		err := k.cl.Get(ctx, client.ObjectKey{Name: k.node}, &kmmv1beta1.NodeModulesConfig{})
		return apierrors.IsNotFound(err), fmt.Sprintf("NMC %s: %v", k.node, err)
	})
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		var names []string
		for _, p := range pods {
			names = append(names, p.Name)
		}
		return len(pods) == 0, fmt.Sprintf("pods left: %v", names)
	})
	tm.add("delete: Modules deleted → NMC and every pod gone", start)
	// Every label kmm set is gone; the user's version-module labels are the user's to remove.
	user := []string{kmmv1beta1.ModuleVersionLabel(kmmNamespace, modKmod), kmmv1beta1.ModuleVersionLabel(kmmNamespace, modDRA)}
	for key := range k.nodeLabels(t) {
		if strings.Contains(key, kmmNamespace+".") && !slices.Contains(user, key) {
			t.Errorf("node label %s left", key)
		}
	}
	for _, key := range user {
		k.setNodeLabel(t, key, "")
	}
	k.checkDeviceClassGone(t)
	// An unload pod ran for each Module, and the device plugin's and DRA driver's DaemonSets are gone.
	events := k.pods.since(mark)
	for _, m := range []string{modKmod, modRestart, modLate, modDRA} {
		if indexOf(events, func(e podEvent) bool {
			return isWorker(e.pod, m) && e.pod.Labels[contract.LabelAction] == "unload" && e.pod.Status.Phase == corev1.PodSucceeded
		}) < 0 {
			t.Errorf("no unload pod of %s Succeeded\n%s", m, describeEvents(events))
		}
	}
	if ds, err := k.cs.AppsV1().DaemonSets(kmmNamespace).List(ctx, metav1.ListOptions{}); err != nil || len(ds.Items) != 0 {
		t.Errorf("DaemonSets left: %v %v", ds, err)
	}
}

// pair is the NMC status entry of a Module of kmmNamespace on the node (nil when none).
func (k *kmmEnv) pair(t *testing.T, name string) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	return k.pairIn(t, kmmNamespace, name)
}

// pairIn is the NMC status entry of a Module of namespace ns on the node (nil when none).
func (k *kmmEnv) pairIn(t *testing.T, ns, name string) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := k.cl.Get(context.Background(), client.ObjectKey{Name: k.node}, nmc); err != nil {
		if !apierrors.IsNotFound(err) {
			t.Logf("reading NMC %s: %v", k.node, err)
		}
		return nil
	}
	return nmc.StatusEntry(ns, name)
}

// waitLoaded waits until the Module's pair is Loaded with version and returns its status entry.
func (k *kmmEnv) waitLoaded(t *testing.T, name, version string) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	var st *kmmv1beta1.NodeModuleStatus
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		st = k.pair(t, name)
		return st != nil && st.State == kmmv1beta1.StateLoaded && st.Config != nil && st.Config.Version == version,
			describeStatus(st) + "; worker pods: " + fmt.Sprint(k.pods.workerRuns(name))
	})
	return st
}

// waitDevicePlugin waits until the device plugin pod of the version runs on the node and is Ready.
func (k *kmmEnv) waitDevicePlugin(t *testing.T, name, version string) {
	t.Helper()
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		var seen []string
		for i := range pods {
			p := &pods[i]
			if devicePluginVersion(p, name) != version {
				continue
			}
			if p.Spec.NodeName == k.node && p.Status.Phase == corev1.PodRunning && podReady(p) && p.DeletionTimestamp == nil {
				return true, ""
			}
			seen = append(seen, p.Name+" "+string(p.Status.Phase)+describe(p))
		}
		return false, fmt.Sprintf("device plugin pods of %s %s: %v", name, version, seen)
	})
}

// waitNoWorkerPod waits until the Module has no worker pod left.
func (k *kmmEnv) waitNoWorkerPod(t *testing.T, name string) {
	t.Helper()
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		for i := range pods {
			if isWorker(&pods[i], name) {
				return false, "worker pod left: " + pods[i].Name + " " + string(pods[i].Status.Phase)
			}
		}
		return true, ""
	})
}

// waitPods polls the pods of kmmNamespace until cond holds.
func (k *kmmEnv) waitPods(t *testing.T, cond func([]corev1.Pod) (bool, string)) {
	t.Helper()
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		pods, err := k.cs.CoreV1().Pods(kmmNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cond(pods.Items)
	})
}

// leader is the holder of the operator's leader election Lease.
func (k *kmmEnv) leader(t *testing.T) string {
	t.Helper()
	lease, err := k.cs.CoordinationV1().Leases(operatorNamespace).Get(context.Background(), app.LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil {
		return *h
	}
	return ""
}

// operatorPod is the one operator pod, Ready.
func (k *kmmEnv) operatorPod(t *testing.T) *corev1.Pod {
	t.Helper()
	pods, err := k.cs.CoreV1().Pods(operatorNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || !podReady(&pods.Items[0]) {
		t.Fatalf("want one Ready operator pod: %s", k.operatorPodState())
	}
	return &pods.Items[0]
}

func (k *kmmEnv) nodeLabels(t *testing.T) map[string]string {
	t.Helper()
	n, err := k.cs.CoreV1().Nodes().Get(context.Background(), k.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

// setNodeLabel sets a node label, or removes it when value is "".
func (k *kmmEnv) setNodeLabel(t *testing.T, key, value string) {
	t.Helper()
	var v *string
	if value != "" {
		v = &value
	}
	setNodeLabel(t, k.c, key, v)
}

// kubectl runs bin/kubectl-kmm against the cluster.
func (k *kmmEnv) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	args = append(args, "--kubeconfig", k.c.KubeconfigPath())
	out, err := exec.Command(k.kubectlKMM, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kmm %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// terminationResult parses the worker's result from a finished worker pod.
func terminationResult(t *testing.T, pod *corev1.Pod) contract.Result {
	t.Helper()
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == contract.ContainerName && cs.State.Terminated != nil {
			res, err := contract.ParseResult([]byte(cs.State.Terminated.Message))
			if err != nil {
				t.Fatalf("the termination message of %s: %v: %q", pod.Name, err, cs.State.Terminated.Message)
			}
			return res
		}
	}
	t.Fatalf("worker pod %s has no terminated worker container: %s", pod.Name, describe(pod))
	return contract.Result{}
}

func isWorker(p *corev1.Pod, module string) bool {
	return p.Labels[contract.LabelWorker] == "true" && p.Labels[contract.LabelModuleName] == module
}

// devicePluginVersion is the version of the Module's device plugin a pod belongs to ("" when it is
// not one of its device plugin pods): the version-schedule-pod label its node selector requires.
func devicePluginVersion(p *corev1.Pod, module string) string {
	if p.Labels[contract.LabelDevicePlugin] != "true" || p.Labels[contract.LabelModuleName] != module {
		return ""
	}
	if v := p.Spec.NodeSelector[kmmv1beta1.DevicePluginVersionLabel(kmmNamespace, module)]; v != "" {
		return v
	}
	return "unversioned"
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describe is a pod's reason and container states, for failure messages.
func describe(p *corev1.Pod) string {
	s := ""
	if p.Status.Reason != "" {
		s += " " + p.Status.Reason
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch st := cs.State; {
		case st.Waiting != nil:
			s += fmt.Sprintf(" %s: waiting %s %s;", cs.Name, st.Waiting.Reason, st.Waiting.Message)
		case st.Terminated != nil:
			s += fmt.Sprintf(" %s: exit %d %s %q;", cs.Name, st.Terminated.ExitCode, st.Terminated.Reason, st.Terminated.Message)
		case st.Running != nil:
			s += fmt.Sprintf(" %s: running (ready %v, restarts %d);", cs.Name, cs.Ready, cs.RestartCount)
		}
	}
	return s
}

func describeStatus(st *kmmv1beta1.NodeModuleStatus) string {
	if st == nil {
		return "no status entry"
	}
	version := ""
	if st.Config != nil {
		version = " loaded version " + st.Config.Version
	}
	return fmt.Sprintf("%s (%s) %s, attempts %d%s", st.State, st.Reason, st.Message, st.Attempts, version)
}

func indexOf(events []podEvent, match func(podEvent) bool) int {
	return slices.IndexFunc(events, match)
}

// isSubsequence says whether want appears in got in order (not necessarily adjacent).
func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// parallel runs the functions at once and returns their errors joined.
func parallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	return errors.Join(errs...)
}
