//go:build e2e && e2ekernel

package e2e_test

import (
	"context"
	"fmt"
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/e2e"
	"github.com/kmm-project/kmm/test/e2e/kernelview"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/poll"
)

// The Modules of TestKernel, in one namespace, all selecting the guest node only.
const (
	kernelNamespace = "e2e-kernel"
	// modMain loads kmm_e2e (with a device plugin, removing the in-tree module first) and goes
	// through the image bump, the ordered upgrade, the reboot and the kernel upgrade.
	modMain = "kmm-e2e"
	// modFirmware loads kmm_fw, whose init needs its firmware; it is unloaded while in use.
	modFirmware = "kmm-fw"
	// modCloudOnly loads kmm_co and has a kernel mapping for the cloud kernel only.
	modCloudOnly = "kmm-cloud-only"
	// firmwareFile is the firmware kmm_fw requests; firmwareLine its first line.
	firmwareFile = "kmm_e2e_fw.bin"
	firmwareLine = "kmm-e2e-firmware-1"
)

// kernelModuleOf are the kernel modules of the Modules.
var kernelModuleOf = map[string]string{modMain: "kmm_e2e", modFirmware: "kmm_fw", modCloudOnly: "kmm_co"}

// kernelWait bounds each wait of TestKernel: under TCG a worker pod takes 5-15 s from creation
// to its end, a boot about 15-40 s.
const kernelWait = 4 * time.Minute

// kernelEnv is kmm installed on the cluster with the qemu guest as a second node.
type kernelEnv struct {
	c              *e2e.Cluster
	g              *e2e.Guest
	cl             client.Client
	cs             kubernetes.Interface
	cloud, generic *e2e.DebianKernel
	// images are the kmod images' references by "<module>:<version>-<flavour>", as the worker
	// pods on the guest pull them (the registry at the guest's node IP).
	images      map[string]string
	holderImage string
	pods        *podRecorder
	// mainVersion is the version of kmm_e2e the steps so far left loaded.
	mainVersion string
}

// TestKernel runs kmm with worker pods that load real modules into a real kernel: a qemu guest
// (TCG) booting Debian's cloud kernel joins the cluster as a second node, kmm is installed from
// its own images and config/ without dry-run, and every Module selects the guest only. Each step
// is checked in the guest kernel's own view (/proc/modules, /sys/module, the kernel log, read by
// the guest's init), not only in kmm's status. Steps start from the state the one before left.
func TestKernel(t *testing.T) {
	c := cluster(t)
	c.WaitNodeReady(t, 2*time.Minute)
	k := setUpKernel(t, c)
	steps := []struct {
		name string
		run  func(*testing.T, *kernelEnv)
	}{
		{"1 a Module loads a real out-of-tree module, removing an in-tree one first", testRealLoad},
		{"3 an ordered upgrade v1 to v2 unloads and loads", testRealOrderedUpgrade},
		{"2 firmware: the worker installs it, the kernel finds it", testFirmware},
		{"3 an image bump reloads", testImageBump},
		{"4 unloading a module in use backs off with Busy until the holder is gone", testBusy},
		{"5 a real reboot: the module is loaded again in the new boot", testReboot},
		{"6 a real kernel upgrade: the other kernel's mapping, and a Module without one says so", testKernelUpgrade},
		{"7 deleting the Module unloads it", testRealDelete},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, k) }) {
			t.FailNow()
		}
	}
	if p := k.pods.problems(); len(p) > 0 {
		t.Errorf("seen from the pod watch:\n%s", strings.Join(p, "\n"))
	}
}

// setUpKernel fetches the two Debian kernels, builds the kmod images from C for them and kmm's
// images, boots the guest, pushes the images and installs kmm (test/e2e/kernel-overlay).
func setUpKernel(t *testing.T, c *e2e.Cluster) *kernelEnv {
	ctx := context.Background()
	cl, err := c.Client(install.Scheme(app.NewScheme()))
	if err != nil {
		t.Fatal(err)
	}
	k := &kernelEnv{c: c, cl: cl, cs: c.Clientset(), images: map[string]string{}}
	cache := filepath.Join(shared.root, "bin", "e2e-kernel-cache")
	start := time.Now()
	err = parallel(
		func() error { return makeImages(filepath.Join(c.LogDir(), "make-images.log")) },
		func() (err error) {
			if k.cloud, err = e2e.FetchKernel(cache, e2e.FlavourCloud); err != nil {
				return err
			}
			k.generic, err = e2e.FetchKernel(cache, e2e.FlavourGeneric)
			return err
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	tm.add("make images (linux/"+runtime.GOARCH+") beside fetching the cloud and generic kernels and headers", start)
	start = time.Now()
	k.g, err = c.StartGuest(ctx, e2e.GuestOptions{Kernels: []*e2e.DebianKernel{k.cloud, k.generic}})
	if err != nil {
		t.Fatal(err)
	}
	tm.add("guest: initramfs built, qemu started → node registered", start)
	start = time.Now()
	poll.Until(t, kernelWait, 250*time.Millisecond, func() (bool, string) { return k.g.NodeReady(ctx) })
	tm.add("guest: node registered → Ready", start)

	start = time.Now()
	if err := k.buildKmods(); err != nil {
		t.Fatal(err)
	}
	holder, err := e2e.GoBinaryImage(ctx, filepath.Join(c.Dir, "bin"), "github.com/kmm-project/kmm/test/e2e/holder")
	if err != nil {
		t.Fatal(err)
	}
	if k.holderImage, err = c.PushImage("kmm-e2e-kernel/holder:1", holder); err != nil {
		t.Fatal(err)
	}
	tm.add("kmod images built from C with the kernels' headers and pushed, holder image", start)
	start = time.Now()
	managerRef, err := c.PushLayout("kmm/kmm-manager:e2e", filepath.Join(shared.root, "bin", "images", "kmm-manager"))
	if err != nil {
		t.Fatal(err)
	}
	workerRef, err := c.PushLayout("kmm/kmm-worker:e2e", filepath.Join(shared.root, "bin", "images", "kmm-worker"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kernelNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	watchCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	if k.pods, err = recordPods(watchCtx, k.cs, kernelNamespace, &wg); err != nil {
		t.Fatal(err)
	}
	if err := followOperatorLogs(watchCtx, k.cs, c.LogDir(), &wg); err != nil {
		t.Fatal(err)
	}
	installKMM(t, c, cl, "kernel-overlay", []string{"kmm-manager=" + managerRef, "kmm-worker=" + workerRef}, map[string]string{})
	k.waitWebhook(t)
	tm.add("install from config/ (test/e2e/kernel-overlay, no dry-run) → webhook answering", start)
	return k
}

// buildKmods compiles test/e2e/kmod/kmm_e2e.c for the kernels and pushes one image per build.
func (k *kernelEnv) buildKmods() error {
	builds := []struct {
		kernel          *e2e.DebianKernel
		module, version string
		firmware        bool
	}{
		{k.cloud, modMain, "v1", false}, {k.cloud, modMain, "v1.1", false}, {k.cloud, modMain, "v2", false},
		{k.generic, modMain, "v1", false}, {k.generic, modMain, "v1.1", false}, {k.generic, modMain, "v2", false},
		{k.cloud, modFirmware, "v1", true}, {k.cloud, modFirmware, "v1.1", true},
		{k.cloud, modCloudOnly, "v1", false},
	}
	var fns []func() error
	var mu sync.Mutex
	for _, b := range builds {
		fns = append(fns, func() error {
			spec := e2e.KmodSpec{Name: kernelModuleOf[b.module], Version: b.version}
			var fw map[string][]byte
			if b.firmware {
				spec.Firmware = firmwareFile
				fw = map[string][]byte{firmwareFile: []byte(firmwareLine + "\nthe rest of the firmware\n")}
			}
			ko, err := e2e.BuildKmod(b.kernel, spec)
			if err != nil {
				return err
			}
			img, err := e2e.KmodImage(b.kernel.Release, map[string][]byte{spec.Name: ko}, fw)
			if err != nil {
				return err
			}
			tag := b.version + "-" + b.kernel.Release
			if _, err := k.c.PushImage("kmm-e2e-kernel/"+spec.Name+":"+tag, img); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			k.images[b.module+":"+b.version+"-"+b.kernel.Flavour] = k.g.RegistryAddr() + "/kmm-e2e-kernel/" + spec.Name + ":" + b.version + "-$KERNEL_FULL_VERSION"
			return nil
		})
	}
	return parallel(fns...)
}

// waitWebhook waits until the API server gets an answer from kmm's webhook: a dry-run create of an
// invalid Module is denied by it.
func (k *kernelEnv) waitWebhook(t *testing.T) {
	bad := k.module(modMain, "", "v1")
	bad.Name = "invalid"
	bad.Spec.ModuleLoader.Container.KernelMappings = []kmmv1beta1.KernelMapping{{Regexp: "(", ContainerImage: k.images[modMain+":v1-"+e2e.FlavourCloud]}}
	poll.Until(t, 3*time.Minute, 500*time.Millisecond, func() (bool, string) {
		err := k.cl.Create(context.Background(), bad, client.DryRunAll)
		if err == nil {
			t.Fatal("an invalid Module was accepted (dry run)")
		}
		return strings.Contains(err.Error(), "denied the request"), err.Error()
	})
}

// module is a Module of kernelNamespace selecting the guest node, loading kernelModuleOf[name]:
// a kernel mapping for the cloud kernel, and for modMain one for the generic kernel too. The image is the build of version; a Module with a version label gets
// moduleVersion.
func (k *kernelEnv) module(name, moduleVersion, version string) *kmmv1beta1.Module {
	mappings := []kmmv1beta1.KernelMapping{{Literal: k.cloud.Release, ContainerImage: k.images[name+":"+version+"-"+e2e.FlavourCloud]}}
	if name == modMain {
		mappings = append(mappings, kmmv1beta1.KernelMapping{Regexp: `^6\.1\.0-[0-9]+-amd64$`, ContainerImage: k.images[name+":"+version+"-"+e2e.FlavourGeneric]})
	}
	return &kmmv1beta1.Module{
		ObjectMeta: metav1.ObjectMeta{Namespace: kernelNamespace, Name: name},
		Spec: kmmv1beta1.ModuleSpec{
			Selector: map[string]string{corev1.LabelHostname: k.g.Name()},
			ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
				Version:        moduleVersion,
				RegistryTLS:    kmmv1beta1.TLSOptions{Insecure: true},
				Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: kernelModuleOf[name]},
				KernelMappings: mappings,
			}},
		},
	}
}

func testRealLoad(t *testing.T, k *kernelEnv) {
	ctx := context.Background()
	before := k.kernelState(t)
	if m := before.Modules[e2e.InTreeModule]; !m.Loaded || !m.SysModule {
		t.Fatalf("the guest did not load the in-tree module %s at boot: %+v", e2e.InTreeModule, m)
	}
	if m := before.Modules["kmm_e2e"]; m.Loaded || m.SysModule {
		t.Fatalf("kmm_e2e is in the kernel before any Module: %+v", m)
	}
	k.setGuestLabel(t, kmmv1beta1.ModuleVersionLabel(kernelNamespace, modMain), "v1")
	m := k.module(modMain, "v1", "v1")
	m.Spec.ModuleLoader.Container.KernelMappings[0].InTreeModulesToRemove = []string{e2e.InTreeModule}
	m.Spec.ModuleLoader.Container.KernelMappings[1].InTreeModulesToRemove = []string{e2e.InTreeModule}
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: k.c.PauseImage()}}
	start := time.Now()
	if err := k.cl.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	st := k.waitState(t, modMain, kmmv1beta1.StateLoaded, "v1")
	tm.add("1 load: Module created → NMC status Loaded (real insmod in the guest)", start)
	k.waitDevicePlugin(t, modMain, "v1")
	tm.add("1 load: Module created → device plugin pod Ready on the guest", start)

	// The kernel's own view.
	s := k.kernelState(t)
	if got := s.Modules["kmm_e2e"]; !got.Loaded || got.State != "Live" || !got.SysModule || got.Version != "v1" {
		t.Errorf("kmm_e2e in the guest kernel: %+v, want Live in /proc/modules, /sys/module/kmm_e2e, version v1", got)
	}
	if got := s.Modules[e2e.InTreeModule]; got.Loaded || got.SysModule {
		t.Errorf("the in-tree module %s is still in the guest kernel: %+v", e2e.InTreeModule, got)
	}
	k.wantKmsg(t, "kmm_e2e: version v1 loaded")
	k.mainVersion = "v1"
	if st.BootID != s.BootID {
		t.Errorf("the status records boot ID %q, the guest kernel's is %q", st.BootID, s.BootID)
	}
	poll.Until(t, time.Minute, 250*time.Millisecond, func() (bool, string) {
		labels := k.guestLabels(t)
		for key, want := range map[string]string{
			kmmv1beta1.ReadyLabel(kernelNamespace, modMain):             "",
			kmmv1beta1.VersionReadyLabel(kernelNamespace, modMain):      "v1",
			kmmv1beta1.DevicePluginReadyLabel(kernelNamespace, modMain): "",
		} {
			if got, ok := labels[key]; !ok || got != want {
				return false, fmt.Sprintf("node label %s = %q (set %v), want %q", key, got, ok, want)
			}
		}
		return true, ""
	})
	// The one worker pod: on the guest, not a dry run, its result a load of this kernel.
	k.waitNoWorkerPod(t, modMain)
	runs := k.pods.workerRuns(modMain)
	if len(runs) != 1 || runs[0].action != "load" || runs[0].last.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("worker pods of %s: %v, want one load that Succeeded", modMain, runs)
	}
	p := runs[0].last
	if p.Spec.NodeName != k.g.Name() || slices.Contains(p.Spec.Containers[0].Args, "--dry-run") {
		t.Errorf("worker pod %s on %s with args %v: want the guest node and no --dry-run", p.Name, p.Spec.NodeName, p.Spec.Containers[0].Args)
	}
	if res := terminationResult(t, p); res.Outcome != contract.OutcomeSucceeded || res.Kernel != k.cloud.Release || res.BootID != s.BootID {
		t.Errorf("the worker's result %+v: want a success for kernel %s, boot %s", res, k.cloud.Release, s.BootID)
	}
}

func testRealDelete(t *testing.T, k *kernelEnv) {
	ctx := context.Background()
	start := time.Now()
	list := &kmmv1beta1.ModuleList{}
	if err := k.cl.List(ctx, list, client.InNamespace(kernelNamespace)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if err := k.cl.Delete(ctx, &list.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, kernelWait, 250*time.Millisecond, func() (bool, string) {
		left := &kmmv1beta1.ModuleList{}
		if err := k.cl.List(ctx, left, client.InNamespace(kernelNamespace)); err != nil {
			return false, err.Error()
		}
		return len(left.Items) == 0, fmt.Sprintf("%d Modules left", len(left.Items))
	})
	tm.add("7 delete: Modules deleted → unloaded, finalizers released", start)
	s := k.kernelState(t)
	for _, mod := range kernelModuleOf {
		if got := s.Modules[mod]; got.Loaded || got.SysModule {
			t.Errorf("%s is still in the guest kernel after its Module was deleted: %+v", mod, got)
		}
	}
	k.wantKmsg(t, "kmm_e2e: version "+k.mainVersion+" unloaded")
	poll.Until(t, kernelWait, 250*time.Millisecond, func() (bool, string) {
		err := k.cl.Get(ctx, client.ObjectKey{Name: k.g.Name()}, &kmmv1beta1.NodeModulesConfig{})
		return apierrors.IsNotFound(err), fmt.Sprintf("NMC %s: %v", k.g.Name(), err)
	})
	for key := range k.guestLabels(t) {
		if strings.Contains(key, kernelNamespace+".") && key != kmmv1beta1.ModuleVersionLabel(kernelNamespace, modMain) {
			t.Errorf("node label %s left", key)
		}
	}
}

// kernelState is the guest kernel's view of the test's modules and the in-tree one.
func (k *kernelEnv) kernelState(t *testing.T) kernelview.State {
	t.Helper()
	s, err := k.g.State(append(slices.Sorted(mapValues(kernelModuleOf)), e2e.InTreeModule)...)
	if err != nil {
		t.Fatalf("reading the guest kernel's state: %v", err)
	}
	return s
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// wantKmsg waits until the guest kernel's log has a line containing want.
func (k *kernelEnv) wantKmsg(t *testing.T, want string) {
	t.Helper()
	poll.Until(t, 30*time.Second, 500*time.Millisecond, func() (bool, string) {
		log, err := k.g.Kmsg()
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(log, want), fmt.Sprintf("no %q in the guest kernel's log; its last lines:\n%s", want, lastLines(log, 15))
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pair is the NMC status entry of a Module of kernelNamespace on the guest (nil when none).
func (k *kernelEnv) pair(t *testing.T, name string) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	nmc := &kmmv1beta1.NodeModulesConfig{}
	if err := k.cl.Get(context.Background(), client.ObjectKey{Name: k.g.Name()}, nmc); err != nil {
		return nil
	}
	return nmc.StatusEntry(kernelNamespace, name)
}

// waitState waits until the Module's pair on the guest is in state with the loaded version (for
// Loaded) and returns its status entry.
func (k *kernelEnv) waitState(t *testing.T, name string, state kmmv1beta1.ModuleState, version string) *kmmv1beta1.NodeModuleStatus {
	t.Helper()
	var st *kmmv1beta1.NodeModuleStatus
	poll.Until(t, kernelWait, 250*time.Millisecond, func() (bool, string) {
		st = k.pair(t, name)
		ok := st != nil && st.State == state
		if ok && state == kmmv1beta1.StateLoaded {
			ok = st.Config != nil && st.Config.Version == version
		}
		return ok, describeStatus(st) + "; worker pods: " + fmt.Sprint(k.pods.workerRuns(name))
	})
	return st
}

// waitDevicePlugin waits until the device plugin pod of the version runs on the guest, Ready.
func (k *kernelEnv) waitDevicePlugin(t *testing.T, name, version string) {
	t.Helper()
	k.waitPods(t, func(pods []corev1.Pod) (bool, string) {
		var seen []string
		for i := range pods {
			p := &pods[i]
			if devicePluginVersionIn(p, kernelNamespace, name) != version {
				continue
			}
			if p.Spec.NodeName == k.g.Name() && p.Status.Phase == corev1.PodRunning && podReady(p) && p.DeletionTimestamp == nil {
				return true, ""
			}
			seen = append(seen, p.Name+" "+string(p.Status.Phase)+describe(p))
		}
		return false, fmt.Sprintf("device plugin pods of %s %s: %v", name, version, seen)
	})
}

// devicePluginVersionIn is devicePluginVersion for a Module of namespace.
func devicePluginVersionIn(p *corev1.Pod, namespace, module string) string {
	if p.Labels[contract.LabelDevicePlugin] != "true" || p.Labels[contract.LabelModuleName] != module {
		return ""
	}
	if v := p.Spec.NodeSelector[kmmv1beta1.DevicePluginVersionLabel(namespace, module)]; v != "" {
		return v
	}
	return "unversioned"
}

func (k *kernelEnv) waitNoWorkerPod(t *testing.T, name string) {
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

func (k *kernelEnv) waitPods(t *testing.T, cond func([]corev1.Pod) (bool, string)) {
	t.Helper()
	poll.Until(t, kernelWait, 250*time.Millisecond, func() (bool, string) {
		pods, err := k.cs.CoreV1().Pods(kernelNamespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cond(pods.Items)
	})
}

func (k *kernelEnv) guestLabels(t *testing.T) map[string]string {
	t.Helper()
	n, err := k.cs.CoreV1().Nodes().Get(context.Background(), k.g.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

// setGuestLabel sets a label of the guest node, or removes it when value is "".
func (k *kernelEnv) setGuestLabel(t *testing.T, key, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, key, v)
	if _, err := k.cs.CoreV1().Nodes().Patch(context.Background(), k.g.Name(), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func testRealOrderedUpgrade(t *testing.T, k *kernelEnv) {
	// The Module moves to v2 (its images with it), then the node's version label.
	start := time.Now()
	k.updateModule(t, modMain, func(m *kmmv1beta1.Module) {
		want := k.module(modMain, "v2", "v2").Spec.ModuleLoader.Container
		for i := range m.Spec.ModuleLoader.Container.KernelMappings {
			m.Spec.ModuleLoader.Container.KernelMappings[i].ContainerImage = want.KernelMappings[i].ContainerImage
		}
		m.Spec.ModuleLoader.Container.Version = "v2"
	})
	// Nothing moves before the label does.
	if s := k.kernelState(t); s.Modules["kmm_e2e"].Version != "v1" {
		t.Errorf("kmm_e2e %+v before the node's version label moved, want v1 still", s.Modules["kmm_e2e"])
	}
	k.setGuestLabel(t, kmmv1beta1.ModuleVersionLabel(kernelNamespace, modMain), "v2")
	k.waitKernelVersion(t, "kmm_e2e", "v2")
	k.waitState(t, modMain, kmmv1beta1.StateLoaded, "v2")
	k.waitDevicePlugin(t, modMain, "v2")
	tm.add("3 ordered upgrade: version label v2 → v2 in the guest kernel, Loaded, its device plugin Ready", start)
	k.wantKmsg(t, "kmm_e2e: version v1 unloaded")
	k.wantKmsg(t, "kmm_e2e: version v2 loaded")
	k.mainVersion = "v2"
	poll.Until(t, time.Minute, 250*time.Millisecond, func() (bool, string) {
		v := k.guestLabels(t)[kmmv1beta1.VersionReadyLabel(kernelNamespace, modMain)]
		return v == "v2", "version.ready label " + v
	})
}

// testImageBump changes the image of the (unversioned) firmware Module to a build whose module
// says v1.1: the worker unloads v1 and loads v1.1, with its firmware.
func testImageBump(t *testing.T, k *kernelEnv) {
	start := time.Now()
	k.updateModule(t, modFirmware, func(m *kmmv1beta1.Module) {
		m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage = k.images[modFirmware+":v1.1-"+e2e.FlavourCloud]
	})
	k.waitKernelVersion(t, "kmm_fw", "v1.1")
	st := k.waitState(t, modFirmware, kmmv1beta1.StateLoaded, "")
	tm.add("3 image bump → reloaded, v1.1 in the guest kernel", start)
	if !strings.Contains(st.Config.ContainerImage, ":v1.1-") {
		t.Errorf("the status records image %s, want the v1.1 build", st.Config.ContainerImage)
	}
	k.wantKmsg(t, "kmm_fw: version v1 unloaded")
	k.wantKmsg(t, "kmm_fw: version v1.1 loaded")
	if fw := k.kernelState(t).Modules["kmm_fw"]; fw.Parameters["firmware"] != firmwareLine {
		t.Errorf("kmm_fw v1.1 in the guest kernel: %+v, want its firmware %q", fw, firmwareLine)
	}
}

func testFirmware(t *testing.T, k *kernelEnv) {
	ctx := context.Background()
	// Without modprobe.firmwarePath the worker installs no firmware: the module's init fails.
	start := time.Now()
	if err := k.cl.Create(ctx, k.module(modFirmware, "", "v1")); err != nil {
		t.Fatal(err)
	}
	st := k.waitState(t, modFirmware, kmmv1beta1.StateLoadBackOff, "")
	t.Logf("without its firmware: %s", describeStatus(st))
	k.wantKmsg(t, "kmm_fw: firmware "+firmwareFile+" not found")
	if s := k.kernelState(t); s.Modules["kmm_fw"].Loaded {
		t.Errorf("kmm_fw loaded without its firmware: %+v", s.Modules["kmm_fw"])
	}
	tm.add("2 firmware: Module without firmwarePath → LoadBackOff, the kernel found no firmware", start)

	start = time.Now()
	k.updateModule(t, modFirmware, func(m *kmmv1beta1.Module) {
		m.Spec.ModuleLoader.Container.Modprobe.FirmwarePath = "/firmware"
	})
	k.waitState(t, modFirmware, kmmv1beta1.StateLoaded, "")
	tm.add("2 firmware: firmwarePath set → Loaded", start)
	s := k.kernelState(t)
	fw := s.Modules["kmm_fw"]
	if !fw.Loaded || fw.State != "Live" || fw.Parameters["firmware"] != firmwareLine {
		t.Errorf("kmm_fw in the guest kernel: %+v, want Live with the firmware's first line %q", fw, firmwareLine)
	}
	if strings.TrimSuffix(s.FirmwareClassPath, "/") != contract.DefaultFirmwareHostPath {
		t.Errorf("/sys/module/firmware_class/parameters/path = %q, want %s", s.FirmwareClassPath, contract.DefaultFirmwareHostPath)
	}
	k.wantKmsg(t, "kmm_fw: firmware "+firmwareFile+" loaded")
}

func testBusy(t *testing.T, k *kernelEnv) {
	ctx := context.Background()
	holder := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: kernelNamespace, Name: "holder"},
		Spec: corev1.PodSpec{
			NodeName: k.g.Name(), RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "holder", Image: k.holderImage, Args: []string{"/dev/kmm_fw"},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}},
		},
	}
	if _, err := k.cs.CoreV1().Pods(kernelNamespace).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.c.WaitPodPhase(t, kernelNamespace, holder.Name, corev1.PodRunning, kernelWait)
	poll.Until(t, time.Minute, 500*time.Millisecond, func() (bool, string) {
		m := k.kernelState(t).Modules["kmm_fw"]
		return m.RefCount == 1, fmt.Sprintf("kmm_fw %+v, want a reference from the holder", m)
	})
	start := time.Now()
	if err := k.cl.Delete(ctx, &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: kernelNamespace, Name: modFirmware}}); err != nil {
		t.Fatal(err)
	}
	st := k.waitState(t, modFirmware, kmmv1beta1.StateUnloadBackOff, "")
	tm.add("4 busy: Module deleted while its device is open → UnloadBackOff", start)
	if st.Reason != string(contract.ReasonBusy) {
		t.Errorf("status %s, want the reason Busy", describeStatus(st))
	}
	poll.Until(t, time.Minute, 500*time.Millisecond, func() (bool, string) {
		n, seen := k.events(t, modFirmware, string(contract.ReasonBusy))
		return n == 1, fmt.Sprintf("%d Busy Events on Module %s, want one; Events: %v", n, modFirmware, seen)
	})
	if m := k.kernelState(t).Modules["kmm_fw"]; !m.Loaded {
		t.Errorf("kmm_fw was removed while in use: %+v", m)
	}
	// Still exactly one Event after another failed attempt or two.
	start = time.Now()
	if err := k.cs.CoreV1().Pods(kernelNamespace).Delete(ctx, holder.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, kernelWait, 500*time.Millisecond, func() (bool, string) {
		left := &kmmv1beta1.Module{}
		err := k.cl.Get(ctx, client.ObjectKey{Namespace: kernelNamespace, Name: modFirmware}, left)
		return apierrors.IsNotFound(err), fmt.Sprintf("Module %s: %v; pair %s", modFirmware, err, describeStatus(k.pair(t, modFirmware)))
	})
	tm.add("4 busy: holder pod deleted → unloaded at the next attempt, Module gone", start)
	if m := k.kernelState(t).Modules["kmm_fw"]; m.Loaded || m.SysModule {
		t.Errorf("kmm_fw still in the guest kernel after the holder left: %+v", m)
	}
	k.wantKmsg(t, "kmm_fw: version v1.1 unloaded")
	if n, seen := k.events(t, modFirmware, string(contract.ReasonBusy)); n != 1 {
		t.Errorf("%d Busy Events on Module %s, want one: %v", n, modFirmware, seen)
	}
}

// events counts the Events of reason on the Module (Warning), and lists every Event on it.
func (k *kernelEnv) events(t *testing.T, module, reason string) (int, []string) {
	t.Helper()
	evs, err := k.cs.EventsV1().Events(kernelNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var seen []string
	for _, e := range evs.Items {
		if e.Regarding.Kind != "Module" || e.Regarding.Name != module {
			continue
		}
		seen = append(seen, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Note))
		if e.Reason == reason && e.Type == corev1.EventTypeWarning {
			n++
		}
	}
	return n, seen
}

// updateModule changes the Module with change, retrying on conflicts.
func (k *kernelEnv) updateModule(t *testing.T, name string, change func(*kmmv1beta1.Module)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &kmmv1beta1.Module{}
		if err := k.cl.Get(context.Background(), client.ObjectKey{Namespace: kernelNamespace, Name: name}, m); err != nil {
			return err
		}
		change(m)
		return k.cl.Update(context.Background(), m)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitKernelVersion waits until the guest kernel has the module loaded with the version.
func (k *kernelEnv) waitKernelVersion(t *testing.T, module, version string) {
	t.Helper()
	poll.Until(t, kernelWait, 500*time.Millisecond, func() (bool, string) {
		m := k.kernelState(t).Modules[module]
		return m.Loaded && m.State == "Live" && m.Version == version, fmt.Sprintf("%s in the guest kernel: %+v, want version %s", module, m, version)
	})
}

func testReboot(t *testing.T, k *kernelEnv) {
	ctx := context.Background()
	before := k.kernelState(t)
	mark := k.pods.mark()
	start := time.Now()
	if err := k.g.Reboot(ctx, k.cloud); err != nil {
		t.Fatal(err)
	}
	tm.add("5 reboot: reboot(2) in the guest → the node registered the new boot", start)
	k.waitKernelVersion(t, "kmm_e2e", "v2")
	st := k.waitState(t, modMain, kmmv1beta1.StateLoaded, "v2")
	tm.add("5 reboot: reboot(2) → kmm_e2e loaded again in the new boot, Loaded", start)
	s := k.kernelState(t)
	if s.BootID == before.BootID || st.BootID != s.BootID {
		t.Errorf("boot IDs: before %s, the guest's now %s, the status records %s", before.BootID, s.BootID, st.BootID)
	}
	if m := s.Modules[e2e.InTreeModule]; m.Loaded {
		t.Errorf("the in-tree %s, loaded again at boot, was not removed before the reload: %+v", e2e.InTreeModule, m)
	}
	k.wantKmsg(t, "kmm_e2e: version v2 loaded")
	k.waitDevicePlugin(t, modMain, "v2")
	k.checkNoWorkerWhileNotReady(t, mark)
}

// checkNoWorkerWhileNotReady checks that every worker pod created since mark was created once the
// guest node was Ready again (its Ready condition's last transition, as the API server records
// both with a resolution of one second).
func (k *kernelEnv) checkNoWorkerWhileNotReady(t *testing.T, mark int) {
	t.Helper()
	n, err := k.cs.CoreV1().Nodes().Get(context.Background(), k.g.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ready metav1.Time
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.LastTransitionTime
		}
	}
	created := 0
	for _, e := range k.pods.since(mark) {
		if e.typ != watch.Added || e.pod.Labels[contract.LabelWorker] != "true" {
			continue
		}
		created++
		if e.pod.CreationTimestamp.Before(&ready) {
			t.Errorf("worker pod %s created at %s, before the node was Ready again at %s", e.pod.Name, e.pod.CreationTimestamp, ready)
		}
	}
	t.Logf("%d worker pods created after the boot; the node's Ready condition last changed at %s", created, ready)
}

func testKernelUpgrade(t *testing.T, k *kernelEnv) {
	ctx := context.Background()
	start := time.Now()
	if err := k.cl.Create(ctx, k.module(modCloudOnly, "", "v1")); err != nil {
		t.Fatal(err)
	}
	k.waitKernelVersion(t, "kmm_co", "v1")
	tm.add("6 a Module mapped for the cloud kernel only → kmm_co loaded", start)
	mark := k.pods.mark()
	start = time.Now()
	if err := k.g.Reboot(ctx, k.generic); err != nil {
		t.Fatal(err)
	}
	tm.add("6 kernel upgrade: reboot into "+k.generic.Release+" → the node registered it", start)
	k.waitKernelVersion(t, "kmm_e2e", "v2")
	st := k.waitState(t, modMain, kmmv1beta1.StateLoaded, "v2")
	tm.add("6 kernel upgrade: reboot → kmm_e2e of the generic kernel's mapping loaded, Loaded", start)
	s := k.kernelState(t)
	if s.Release != k.generic.Release {
		t.Fatalf("the guest runs %s, want %s", s.Release, k.generic.Release)
	}
	if !strings.Contains(st.Config.ContainerImage, k.generic.Release) {
		t.Errorf("the status records image %s, want the build for %s", st.Config.ContainerImage, k.generic.Release)
	}
	k.wantKmsg(t, "kmm_e2e: version v2 loaded")
	// The Module without a mapping for this kernel: nothing loaded, no worker pod, and it says so.
	poll.Until(t, kernelWait, 500*time.Millisecond, func() (bool, string) {
		m := &kmmv1beta1.Module{}
		if err := k.cl.Get(ctx, client.ObjectKey{Namespace: kernelNamespace, Name: modCloudOnly}, m); err != nil {
			return false, err.Error()
		}
		for _, c := range m.Status.Conditions {
			if c.Type == kmmv1beta1.ConditionDegraded && c.Status == metav1.ConditionTrue && c.Reason == kmmv1beta1.ReasonNoKernelMapping && strings.Contains(c.Message, k.g.Name()) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("Module %s conditions %+v, want Degraded NoKernelMapping naming %s", modCloudOnly, m.Status.Conditions, k.g.Name())
	})
	if m := k.kernelState(t).Modules["kmm_co"]; m.Loaded || m.SysModule {
		t.Errorf("kmm_co in the guest kernel %s, which no mapping of its Module matches: %+v", k.generic.Release, m)
	}
	for _, e := range k.pods.since(mark) {
		// A pod created after the reboot (the load pod of the old boot is deleted after it).
		if e.typ == watch.Added && isWorker(e.pod, modCloudOnly) {
			t.Errorf("a worker pod for %s after the upgrade: %s %s", modCloudOnly, e.pod.Name, e.pod.Labels[contract.LabelAction])
		}
	}
	k.checkNoWorkerWhileNotReady(t, mark)
}
