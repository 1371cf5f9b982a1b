package worker

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kmm-project/kmm/contract"
)

// entryRoot is where the cache keeps the extraction of digest d for cfg.
func entryRoot(s sandbox, d v1.Hash, cfg contract.Config) string {
	return cache{dir: s.cache}.entry(d, extractKey(cfg.Config))
}

func mustSucceed(t *testing.T, res contract.Result) {
	t.Helper()
	if res.Outcome != contract.OutcomeSucceeded {
		t.Fatalf("outcome %s, reason %s: %s\nstderr: %s", res.Outcome, res.Reason, res.Message, res.Stderr)
	}
}

func TestLoadPullsExtractsAndResolvesTheDependency(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	img := image(t,
		append(kmodEntries(t, "opt"), file("etc/passwd", "root:x:0:0"), file("opt/lib/modules/5.0.0-other/x.ko", "elsewhere")),
	)
	ref, digest := reg.push(t, "kmod/test:v1", img)
	s := newSandbox(t)
	m := newRecorder(t)
	cfg := testConfig(ref)

	res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg)
	mustSucceed(t, res)

	want := contract.Result{Action: contract.ActionLoad, Namespace: "default", Name: "kmm-test", KernelModule: "kmm_test_a", Kernel: testKernel,
		BootID: testBootID, ImageDigest: digest.String(), Outcome: contract.OutcomeSucceeded}
	if res != want {
		t.Errorf("result\n got %+v\nwant %+v", res, want)
	}
	root := entryRoot(s, digest, cfg)
	wantArgs := []string{"-n", "-S", testKernel, "-v", "-d", filepath.Join(root, "opt"), "kmm_test_a"}
	wantCheck := []string{"-n", "-S", testKernel, "--show-depends", "-d", filepath.Join(root, "opt"), "kmm_test_a"}
	if len(m.calls) != 2 || !slices.Equal(m.calls[0], wantCheck) || !slices.Equal(m.calls[1], wantArgs) {
		t.Errorf("modprobe calls %q, want the check %q then the load %q", m.calls, wantCheck, wantArgs)
	}
	// The real modprobe -n resolved kmm_test_a and its dependency from depmod's output, b first.
	out := m.stdout.String()
	ib, ia := strings.Index(out, "extra/kmm_test_b.ko"), strings.Index(out, "extra/kmm_test_a.ko")
	if ib < 0 || ia < 0 || ib > ia || !strings.Contains(out, "insmod "+root) {
		t.Errorf("modprobe -n output should insmod kmm_test_b then kmm_test_a from the cache:\n%s", out)
	}
	// Only the kernel directory was extracted.
	for _, f := range listFiles(t, root) {
		if !strings.HasPrefix(f, "opt/lib/modules/"+testKernel) && f != "opt" && f != "opt/lib" && f != "opt/lib/modules" {
			t.Errorf("extracted %s, which is outside the kernel directory", f)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "opt/lib/modules", testKernel, "modules.dep.bin")); err != nil {
		t.Errorf("depmod output not extracted: %v", err)
	}
}

func TestSecondLoadOfTheSameDigestMakesNoRegistryRequest(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	w := newTestWorker(t, s, newRecorder(t))

	for _, ref := range []string{ref, reg.host + "/kmod/test@" + digest.String()} {
		cfg := testConfig(ref)
		first := w.Run(context.Background(), contract.ActionLoad, cfg)
		mustSucceed(t, first)
		reg.requests.Store(0)
		second := w.Run(context.Background(), contract.ActionLoad, cfg)
		mustSucceed(t, second)
		if n := reg.requests.Load(); n != 0 {
			t.Errorf("%s: second load made %d registry requests, want 0", ref, n)
		}
		if !second.FromCache || second.ImageDigest != digest.String() {
			t.Errorf("%s: second load: fromCache %v digest %s", ref, second.FromCache, second.ImageDigest)
		}
	}
}

func TestPullPolicyAlwaysAsksForTheDigestButReusesTheContent(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	w := newTestWorker(t, s, newRecorder(t))
	cfg := testConfig(ref)
	cfg.Config.ImagePullPolicy = corev1.PullAlways
	mustSucceed(t, w.Run(context.Background(), contract.ActionLoad, cfg))
	reg.requests.Store(0)
	reg.blobGets.Store(0)
	res := w.Run(context.Background(), contract.ActionLoad, cfg)
	mustSucceed(t, res)
	if reg.requests.Load() == 0 || reg.blobGets.Load() != 0 || !res.FromCache {
		t.Errorf("Always: %d requests and %d blob downloads (want some requests, no blob), fromCache %v", reg.requests.Load(), reg.blobGets.Load(), res.FromCache)
	}

	// The tag now points at a new image: Always notices, the default policy keeps the recorded digest.
	ref2, digest2 := reg.push(t, "kmod/test:v1", image(t, append(kmodEntries(t, "opt"), file("opt/lib/modules/"+testKernel+"/new", "v2"))))
	if ref2 != ref || digest2 == digest {
		t.Fatal("test setup: the second push should move the tag")
	}
	if res := w.Run(context.Background(), contract.ActionLoad, cfg); res.ImageDigest != digest2.String() || res.FromCache {
		t.Errorf("Always after a tag move: digest %s fromCache %v, want %s downloaded", res.ImageDigest, res.FromCache, digest2)
	}
	cfg.Config.ImagePullPolicy = corev1.PullIfNotPresent
	reg.requests.Store(0)
	res = w.Run(context.Background(), contract.ActionLoad, cfg)
	if res.ImageDigest != digest2.String() || reg.requests.Load() != 0 {
		t.Errorf("IfNotPresent uses the last recorded digest without asking: got %s with %d requests", res.ImageDigest, reg.requests.Load())
	}
}

func TestPullPolicyNever(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	w := newTestWorker(t, s, newRecorder(t))
	cfg := testConfig(ref)
	cfg.Config.ImagePullPolicy = corev1.PullNever
	res := w.Run(context.Background(), contract.ActionLoad, cfg)
	if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "imagePullPolicy is Never") || reg.requests.Load() != 0 {
		t.Errorf("Never with an empty cache: %s %q after %d requests", res.Reason, res.Message, reg.requests.Load())
	}
	cfg.Config.ImagePullPolicy = ""
	mustSucceed(t, w.Run(context.Background(), contract.ActionLoad, cfg))
	cfg.Config.ImagePullPolicy = corev1.PullNever
	reg.requests.Store(0)
	mustSucceed(t, w.Run(context.Background(), contract.ActionLoad, cfg))
	if reg.requests.Load() != 0 {
		t.Errorf("Never made %d requests", reg.requests.Load())
	}
}

func TestLoadWithModulesLoadingOrderWritesSoftdeps(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	m := newRecorder(t)
	cfg := testConfig(ref)
	cfg.Config.Modprobe.ModuleName = "kmm_test_c"
	cfg.Config.Modprobe.ModulesLoadingOrder = []string{"kmm_test_c", "kmm_test_b"}
	mustSucceed(t, newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg))

	if m.softdep != "softdep kmm_test_c pre: kmm_test_b\n" {
		t.Errorf("softdep config %q", m.softdep)
	}
	args := m.calls[0]
	if i := slices.Index(args, "-C"); i < 0 || !strings.HasPrefix(args[i+1], s.tmp) || args[len(args)-1] != "kmm_test_c" {
		t.Errorf("modprobe args %q should pass the softdep file with -C and end with the module", args)
	}
	// kmm_test_c has no depmod dependency: the softdep alone makes modprobe load kmm_test_b first.
	out := m.stdout.String()
	if ib, ic := strings.Index(out, "kmm_test_b.ko"), strings.Index(out, "kmm_test_c.ko"); ib < 0 || ic < ib {
		t.Errorf("modprobe -n output should load kmm_test_b before kmm_test_c:\n%s", out)
	}
	if entries, _ := os.ReadDir(s.tmp); len(entries) != 0 {
		t.Errorf("the softdep file was not cleaned up: %v", entries)
	}
	_ = digest
}

func TestUnload(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	m := newRecorder(t)
	w := newTestWorker(t, s, m)
	cfg := testConfig(ref)
	cfg.Config.Modprobe.ModulesLoadingOrder = []string{"kmm_test_a", "kmm_test_b"}
	res := w.Run(context.Background(), contract.ActionUnload, cfg)
	mustSucceed(t, res)
	if res.Action != contract.ActionUnload || res.ImageDigest != digest.String() {
		t.Errorf("result %+v", res)
	}
	root := filepath.Join(entryRoot(s, digest, cfg), "opt")
	want := []string{"-n", "-S", testKernel, "-r", "-v", "-d", root, "kmm_test_a", "kmm_test_b"}
	if len(m.calls) != 1 || !slices.Equal(m.calls[0], want) {
		t.Errorf("modprobe calls %q, want %q", m.calls, want)
	}
}

func TestModprobeFailuresAreClassified(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	cfg := testConfig(ref)
	cfg.Config.Modprobe.ModuleName = "kmm_test_missing"
	res := newTestWorker(t, s, newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg)
	if res.Reason != contract.ReasonNotFound || !strings.Contains(res.Stderr, "Module kmm_test_missing not found in directory") ||
		!strings.Contains(res.Message, "not found in directory") {
		t.Errorf("missing module: %s %q stderr %q", res.Reason, res.Message, res.Stderr)
	}

	busy := ModprobeFunc(func(_ context.Context, args []string) ([]byte, []byte, error) {
		return nil, []byte("modprobe: FATAL: Module kmm_test_a is in use.\n"), &exitError{}
	})
	cfg.Config.Modprobe.ModuleName = "kmm_test_a"
	res = newTestWorker(t, s, busy).Run(context.Background(), contract.ActionUnload, cfg)
	if res.Reason != contract.ReasonBusy || res.Outcome != contract.OutcomeFailed || !strings.HasSuffix(res.Message, "is in use.") {
		t.Errorf("busy unload: %+v", res)
	}
}

type exitError struct{}

func (*exitError) Error() string { return "exit status 1" }

func TestInTreeModulesAreRemovedFirst(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	m := newRecorder(t)
	cfg := testConfig(ref)
	cfg.Config.InTreeModulesToRemove = []string{"kmm_intree_x", "kmm_intree_y"}
	// The real modprobe says the in-tree modules are not found (not loaded): that is not an error.
	mustSucceed(t, newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg))
	if len(m.calls) != 4 || !slices.Contains(m.calls[0], "--show-depends") || !slices.Equal(m.calls[1], []string{"-n", "-S", testKernel, "-r", "-v", "kmm_intree_x"}) ||
		!slices.Equal(m.calls[2], []string{"-n", "-S", testKernel, "-r", "-v", "kmm_intree_y"}) || m.calls[3][len(m.calls[3])-1] != "kmm_test_a" {
		t.Errorf("calls %q: want the dependency check, both in-tree removals, then the load", m.calls)
	}

	var calls int
	busy := ModprobeFunc(func(_ context.Context, args []string) ([]byte, []byte, error) {
		if slices.Contains(args, "--show-depends") {
			return nil, nil, nil
		}
		calls++
		return nil, []byte("modprobe: FATAL: Module kmm_intree_x is in use.\n"), &exitError{}
	})
	res := newTestWorker(t, s, busy).Run(context.Background(), contract.ActionLoad, cfg)
	if res.Reason != contract.ReasonBusy || !strings.Contains(res.Message, "removing in-tree module kmm_intree_x") || calls != 1 {
		t.Errorf("in-tree module in use: %s %q after %d calls (the load must not run)", res.Reason, res.Message, calls)
	}
}

func TestFirmwareIsInstalledAndTheLookupPathSet(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	fw := []entry{dir("firmware/"), file("firmware/vendor/dev.bin", "FIRMWARE"), {Name: "firmware/alias.bin", Type: '2', Linkname: "vendor/dev.bin"}}
	ref, _ := reg.push(t, "kmod/fw:v1", image(t, append(kmodEntries(t, "opt"), fw...)))
	s := newSandbox(t)
	cfg := testConfig(ref)
	cfg.Config.Modprobe.FirmwarePath = "/firmware"
	cfg.SetFirmwareClassPath = true
	w := newTestWorker(t, s, newRecorder(t))
	mustSucceed(t, w.Run(context.Background(), contract.ActionLoad, cfg))

	for _, f := range []string{"var/lib/firmware/vendor/dev.bin", "var/lib/firmware/alias.bin"} {
		if data, err := os.ReadFile(filepath.Join(s.root, f)); err != nil || string(data) != "FIRMWARE" {
			t.Errorf("%s: %q, %v", f, data, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(s.root, "sys/module/firmware_class/parameters/path")); err != nil || string(data) != "/var/lib/firmware" {
		t.Errorf("firmware lookup path %q, %v", data, err)
	}

	mustSucceed(t, w.Run(context.Background(), contract.ActionUnload, cfg))
	if _, err := os.Stat(filepath.Join(s.root, "var/lib/firmware/vendor/dev.bin")); !os.IsNotExist(err) {
		t.Errorf("unload should remove the firmware it installed: %v", err)
	}

	// Without the operator setting, firmware is copied but the lookup path is left alone.
	s2 := newSandbox(t)
	cfg.SetFirmwareClassPath = false
	cfg.FirmwareHostPath = "/lib/firmware/updates"
	mustSucceed(t, newTestWorker(t, s2, newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg))
	if _, err := os.Stat(filepath.Join(s2.root, "lib/firmware/updates/vendor/dev.bin")); err != nil {
		t.Errorf("firmware not installed in the configured host path: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s2.root, "sys")); !os.IsNotExist(err) {
		t.Errorf("sysfs written without setFirmwareClassPath: %v", err)
	}
}

func TestNodeHostNeedsTheSysfsAttribute(t *testing.T) {
	root := t.TempDir()
	err := NewNodeHost(root).SetFirmwareClassPath("/var/lib/firmware")
	if err == nil || !strings.Contains(err.Error(), "setting the firmware lookup path") {
		t.Errorf("a node without firmware_class must fail, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "sys")); !os.IsNotExist(err) {
		t.Errorf("a node host must not create sysfs entries: %v", err)
	}
	attr := filepath.Join(root, firmwareClassPath)
	if err := os.MkdirAll(filepath.Dir(attr), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(attr, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := NewNodeHost(root).SetFirmwareClassPath("/var/lib/firmware"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(attr); string(data) != "/var/lib/firmware" {
		t.Errorf("attribute = %q", data)
	}
}

func TestMissingBootIDFails(t *testing.T) {
	s := newSandbox(t)
	if err := os.Remove(filepath.Join(s.root, bootIDPath)); err != nil {
		t.Fatal(err)
	}
	res := newTestWorker(t, s, newRecorder(t)).Run(context.Background(), contract.ActionLoad, testConfig("127.0.0.1:1/x:y"))
	if res.Reason != contract.ReasonOther || !strings.Contains(res.Message, "reading the boot ID") {
		t.Errorf("result %+v", res)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	s := newSandbox(t)
	w := newTestWorker(t, s, newRecorder(t))
	if res := w.Run(context.Background(), contract.Action("restart"), testConfig("r/i:t")); res.Reason != contract.ReasonOther || !strings.Contains(res.Message, `unknown action "restart"`) {
		t.Errorf("unknown action: %+v", res)
	}
	cfg := testConfig("r/i:t")
	cfg.Config.KernelVersion = ""
	if res := w.Run(context.Background(), contract.ActionLoad, cfg); res.Reason != contract.ReasonInvalidConfig || !strings.Contains(res.Message, "kernelVersion is required") {
		t.Errorf("invalid config: %+v", res)
	}
	for _, o := range []Options{{Modprobe: w.opts.Modprobe, Host: w.opts.Host}, {CacheDir: "c", Host: w.opts.Host}, {CacheDir: "c", Modprobe: w.opts.Modprobe}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted incomplete options", o)
		}
	}
}

func TestFirmwareInstallFailureIsReported(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/fw:v1", image(t, append(kmodEntries(t, "opt"), file("firmware/dev.bin", "FW"))))
	s := newSandbox(t)
	// The host's firmware directory is a file: copying into it must fail before modprobe runs.
	if err := os.MkdirAll(filepath.Join(s.root, "var/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.root, "var/lib/firmware"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(ref)
	cfg.Config.Modprobe.FirmwarePath = "/firmware"
	m := newRecorder(t)
	res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, cfg)
	if res.Reason != contract.ReasonOther || !strings.Contains(res.Message, "var/lib/firmware") || len(m.loads()) != 0 {
		t.Errorf("got %s %q after modprobe calls %q", res.Reason, res.Message, m.loads())
	}
}

// TestRelativeCacheDirLoadsAModuleWithADependency: a relative --cache-dir reached modprobe as a
// relative -d, whose insmod lines the path check then resolved against the wrong directory and
// refused every module with a dependency ("resolves to … outside the module directory").
func TestRelativeCacheDirLoadsAModuleWithADependency(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	s := newSandbox(t)
	t.Chdir(filepath.Dir(s.cache))
	m := newRecorder(t)
	cfg := testConfig(ref)
	w := newTestWorker(t, s, m, func(o *Options) { o.CacheDir, o.TempDir = filepath.Base(s.cache), filepath.Base(s.tmp) })
	cfg.Config.Modprobe.ModulesLoadingOrder = []string{"kmm_test_a", "kmm_test_c"}
	mustSucceed(t, w.Run(context.Background(), contract.ActionLoad, cfg))
	root := entryRoot(s, digest, cfg)
	for _, c := range m.calls {
		if i := slices.Index(c, "-d"); i < 0 || c[i+1] != filepath.Join(root, "opt") {
			t.Errorf("modprobe %q: want -d %s (absolute)", c, filepath.Join(root, "opt"))
		}
		if i := slices.Index(c, "-C"); i >= 0 && !filepath.IsAbs(c[i+1]) {
			t.Errorf("modprobe %q: the softdep file is not absolute", c)
		}
	}
	if out := m.stdout.String(); !strings.Contains(out, "insmod "+filepath.Join(root, "opt/lib/modules", testKernel, "extra/kmm_test_b.ko")) {
		t.Errorf("modprobe -n should insmod the dependency kmm_test_b from the cache:\n%s", out)
	}
}
