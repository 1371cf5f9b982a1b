package worker

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/contract"
)

// reloadConfig is a reload from the image prev to the image next of the test module.
func reloadConfig(prev, next string) contract.Config {
	cfg := testConfig(next)
	old := testConfig(prev).Config
	cfg.Previous = &old
	return cfg
}

// TestReloadUnloadsThePreviousImageThenLoadsTheNew runs the real modprobe (dry run): the unload
// uses the previous image's extraction, the load the new one's, in that order, in one run.
func TestReloadUnloadsThePreviousImageThenLoadsTheNew(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	prevRef, prevDigest := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt"), []entry{file("opt/v1", "1")}))
	nextRef, nextDigest := reg.push(t, "kmod/test:v2", image(t, kmodEntries(t, "opt"), []entry{file("opt/v2", "2")}))
	if prevDigest == nextDigest {
		t.Fatal("the two images should differ")
	}
	s := newSandbox(t)
	m := newRecorder(t)
	cfg := reloadConfig(prevRef, nextRef)

	res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionReload, cfg)
	mustSucceed(t, res)
	if res.Action != contract.ActionReload || res.ImageDigest != nextDigest.String() || res.FailedStep != "" || res.BootID != testBootID {
		t.Errorf("result %+v: want action reload, the new image's digest, no failed step", res)
	}
	prevRoot := filepath.Join(entryRoot(s, prevDigest, contract.Config{Config: *cfg.Previous}), "opt")
	nextRoot := filepath.Join(entryRoot(s, nextDigest, cfg), "opt")
	want := [][]string{
		{"-n", "-S", testKernel, "-r", "-v", "-d", prevRoot, "kmm_test_a"},
		{"-n", "-S", testKernel, "--show-depends", "-d", nextRoot, "kmm_test_a"},
		{"-n", "-S", testKernel, "-v", "-d", nextRoot, "kmm_test_a"},
	}
	if !slices.EqualFunc(m.calls, want, slices.Equal[[]string]) {
		t.Errorf("modprobe calls\n got %q\nwant %q", m.calls, want)
	}
	if !strings.Contains(m.stdout.String(), "insmod "+nextRoot) {
		t.Errorf("the load should insmod from the new image's extraction:\n%s", m.stdout.String())
	}
}

// TestReloadReportsTheHalfThatFailed: a busy module fails the unload half and loads nothing; a
// module missing from the new image fails the load half after the unload; a new image that
// cannot be pulled fails before anything is unloaded.
func TestReloadReportsTheHalfThatFailed(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	prevRef, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	nextRef, _ := reg.push(t, "kmod/test:v2", image(t, kmodEntries(t, "opt"), []entry{file("opt/v2", "2")}))

	t.Run("busy", func(t *testing.T) {
		var calls [][]string
		busy := ModprobeFunc(func(_ context.Context, args []string) ([]byte, []byte, error) {
			calls = append(calls, args)
			return nil, []byte("modprobe: FATAL: Module kmm_test_a is in use.\n"), &exitError{}
		})
		res := newTestWorker(t, newSandbox(t), busy).Run(context.Background(), contract.ActionReload, reloadConfig(prevRef, nextRef))
		if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonBusy || res.FailedStep != contract.StepUnload {
			t.Errorf("busy: %+v", res)
		}
		if len(calls) != 1 || !slices.Contains(calls[0], "-r") {
			t.Errorf("only the unload should have run: %q", calls)
		}
	})
	t.Run("load half", func(t *testing.T) {
		m := newRecorder(t)
		cfg := reloadConfig(prevRef, nextRef)
		cfg.Config.Modprobe.ModuleName = "kmm_test_missing"
		res := newTestWorker(t, newSandbox(t), m).Run(context.Background(), contract.ActionReload, cfg)
		if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonNotFound || res.FailedStep != contract.StepLoad {
			t.Errorf("load half: %+v", res)
		}
		if len(m.calls) == 0 || !slices.Contains(m.calls[0], "-r") {
			t.Errorf("the unload should have run first: %q", m.calls)
		}
	})
	t.Run("new image missing", func(t *testing.T) {
		s, m := newSandbox(t), newRecorder(t)
		res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionReload, reloadConfig(prevRef, strings.Replace(nextRef, ":v2", ":v9", 1)))
		if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonImagePull || res.FailedStep != contract.StepUnload {
			t.Errorf("missing image: %+v", res)
		}
		if len(m.calls) != 0 {
			t.Errorf("nothing should have run: %q", m.calls)
		}
	})
	t.Run("no previous config", func(t *testing.T) {
		res := newTestWorker(t, newSandbox(t), newRecorder(t)).Run(context.Background(), contract.ActionReload, testConfig(nextRef))
		if res.Reason != contract.ReasonInvalidConfig || res.FailedStep != contract.StepUnload {
			t.Errorf("reload without a previous config: %+v", res)
		}
		if _, err := res.Marshal(); err != nil {
			t.Fatal(err)
		}
		data, _ := res.Marshal()
		if _, err := contract.ParseResult(data); err != nil {
			t.Errorf("the operator cannot parse the result: %v", err)
		}
	})
}
