//go:build vm

package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kmm-project/kmm/contract"
)

// expectedChecks are the CHECK lines the guest must print, each with PASS.
var expectedChecks = []string{
	"init/setup",
	"boot/kernel", "boot/modules-absent", "boot/registry",
	"patching/two-cpus", "patching/key", "patching/patched", "patching/restored",
	"load/outcome", "load/loaded", "load/parameters", "load/firmware-file", "load/firmware-class-path",
	"unload/outcome", "unload/unloaded", "unload/firmware-removed",
	"intree/preloaded", "intree/outcome", "intree/in-tree-removed", "intree/loaded-with-deps", "intree/removed-first",
	"busy/outcome", "busy/stderr", "busy/still-loaded",
	"unload-deps/outcome", "unload-deps/unloaded-with-deps",
	"order-load/outcome", "order-load/loaded", "order-load/kernel-order", "order-load/insmod-order",
	"order-unload/outcome", "order-unload/unloaded",
	"not-found/outcome",
	"wrong-kernel/outcome", "wrong-kernel/rejected", "wrong-kernel/kernel-log", "wrong-kernel/not-loaded",
	"end/modules-absent",
}

// wantResult is what the host expects of a step's worker result.
type wantResult struct {
	action    contract.Action
	module    string
	outcome   contract.Outcome
	reason    contract.Reason
	image     string // repository:tag whose digest the result must name
	fromCache bool
	// message and stderr are substrings the result's message and stderr must contain.
	message, stderr string
}

// expectedResults are the worker results of the steps, checked on the host from the JSON the
// guest printed.
var expectedResults = map[string]wantResult{
	"load":         {action: contract.ActionLoad, module: "dummy", outcome: contract.OutcomeSucceeded, image: ImageRepo},
	"unload":       {action: contract.ActionUnload, module: "dummy", outcome: contract.OutcomeSucceeded, image: ImageRepo, fromCache: true},
	"intree":       {action: contract.ActionLoad, module: "macvtap", outcome: contract.OutcomeSucceeded, image: ImageRepo},
	"busy":         {action: contract.ActionUnload, module: "macvlan", outcome: contract.OutcomeFailed, reason: contract.ReasonBusy, image: ImageRepo, fromCache: true, message: "is in use", stderr: "Module macvlan is in use"},
	"unload-deps":  {action: contract.ActionUnload, module: "macvtap", outcome: contract.OutcomeSucceeded, image: ImageRepo, fromCache: true},
	"order-load":   {action: contract.ActionLoad, module: "dummy", outcome: contract.OutcomeSucceeded, image: ImageRepo, fromCache: true},
	"order-unload": {action: contract.ActionUnload, module: "dummy", outcome: contract.OutcomeSucceeded, image: ImageRepo, fromCache: true},
	"not-found":    {action: contract.ActionLoad, module: "kmm_absent", outcome: contract.OutcomeFailed, reason: contract.ReasonNotFound, image: ImageRepo, fromCache: true, stderr: "not found"},
	"wrong-kernel": {action: contract.ActionLoad, module: "dummy", outcome: contract.OutcomeFailed, reason: contract.ReasonOther, image: WrongKernelRepo, message: "Exec format error", stderr: "could not insert 'dummy'"},
}

// TestWorkerInVM boots the current Debian cloud kernel under qemu with the real worker binary in
// its initramfs and checks, inside the guest and here, that the worker loads and unloads real
// modules of that kernel.
func TestWorkerInVM(t *testing.T) {
	start := time.Now()
	repo := repoRoot(t)
	cache := filepath.Join(repo, "bin", "vm-cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	qemu := requireQemu(t)
	k := fetchKernel(t, cache)
	t.Logf("kernel %s (%s) ready after %s", k.Version, k.Package, time.Since(start).Round(time.Millisecond))

	work := t.TempDir()
	images := kmodImages(t, k, work)
	writeLayout(t, filepath.Join(work, "layout"), images)
	root := filepath.Join(work, "root")
	stageRoot(t, repo, root, k, filepath.Join(work, "layout"))
	initrd := filepath.Join(cache, "initrd.cpio")
	writeInitramfs(t, root, initrd)
	t.Logf("initramfs %s ready after %s", initrd, time.Since(start).Round(time.Millisecond))

	s := parseSerial(bootVM(t, qemu, k, initrd, filepath.Join(cache, "serial.log")))
	t.Logf("serial console protocol lines:\n%s", strings.Join(s.lines, "\n"))
	checkReport(t, s)
	checkResults(t, s, k, digests(t, images))
	t.Logf("total %s", time.Since(start).Round(time.Millisecond))
}

// checkReport requires the DONE line, no failed check and a PASS for every expected check.
func checkReport(t *testing.T, s serial) {
	t.Helper()
	if s.done == "" {
		t.Errorf("the guest printed no %s%s line: its init died or the VM stopped early (see the serial log)", Prefix, KindDone)
	}
	for _, line := range s.failed {
		t.Errorf("guest check failed: %s", line)
	}
	for _, name := range expectedChecks {
		if s.checks[name] != Pass {
			t.Errorf("check %s: got %q, want %s", name, s.checks[name], Pass)
		}
	}
}

// checkResults asserts on the worker's JSON result of every step.
func checkResults(t *testing.T, s serial, k kernel, digest map[string]string) {
	t.Helper()
	bootID := ""
	for _, step := range sortedKeys(expectedResults) {
		want := expectedResults[step]
		raw, ok := s.results[step]
		if !ok {
			t.Errorf("step %s: no %s line", step, KindResult)
			continue
		}
		res, err := contract.ParseResult([]byte(raw))
		if err != nil {
			t.Errorf("step %s: %v: %s", step, err, raw)
			continue
		}
		if bootID == "" {
			bootID = res.BootID
		}
		checkResult(t, step, res, want, k, digest[want.image])
		if res.BootID == "" || res.BootID != bootID {
			t.Errorf("step %s: bootID %q, want the VM's boot ID %q (the same in every step)", step, res.BootID, bootID)
		}
	}
}

// checkResult compares one result with what the step should give.
func checkResult(t *testing.T, step string, res contract.Result, want wantResult, k kernel, digest string) {
	t.Helper()
	got := wantResult{action: res.Action, module: res.KernelModule, outcome: res.Outcome, reason: res.Reason, image: res.ImageDigest, fromCache: res.FromCache}
	exp := want
	exp.image, exp.message, exp.stderr = digest, "", ""
	if got != exp {
		t.Errorf("step %s: got %+v, want %+v (message %q)", step, got, exp, res.Message)
	}
	if res.Kernel != k.Version || res.Namespace != "kmm-vm" || res.Name != want.module {
		t.Errorf("step %s: kernel %q namespace %q name %q, want %q kmm-vm %q", step, res.Kernel, res.Namespace, res.Name, k.Version, want.module)
	}
	if !strings.Contains(res.Message, want.message) || !strings.Contains(res.Stderr, want.stderr) {
		t.Errorf("step %s: message %q stderr %q, want them to contain %q and %q", step, res.Message, res.Stderr, want.message, want.stderr)
	}
}

// digests returns the digest of each image by repository:tag.
func digests(t *testing.T, images map[string]v1.Image) map[string]string {
	t.Helper()
	out := map[string]string{}
	for repoTag, img := range images {
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out[repoTag] = d.String()
	}
	return out
}

// repoRoot returns the repository's root directory (go test runs in test/vm).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("not in test/vm of the repository: %v", err)
	}
	return root
}
