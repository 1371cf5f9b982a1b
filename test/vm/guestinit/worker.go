package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/vm"
)

// Directories of the worker runs in the guest.
const (
	runDir   = "/tmp/kmm-vm"
	cacheDir = "/tmp/kmm-cache"
)

// workerTimeout bounds one worker run (they take well under a second), so that a hanging step
// fails with its own message before the host's timeout stops the whole VM.
const workerTimeout = 60 * time.Second

// workerRun is what one run of the worker binary gave.
type workerRun struct {
	res  contract.Result
	code int
	// log is the worker's standard error: its JSON log lines.
	log string
	err error
}

// config returns a worker config for moduleName from the image repoTag of the layout.
func (g *guest) config(repoTag, moduleName string, mutate ...func(*contract.Config)) contract.Config {
	cfg := contract.Config{
		Namespace: "kmm-vm",
		Name:      moduleName,
		Config: kmmv1beta1.ModuleConfig{
			KernelVersion:  g.plan.Kernel,
			ContainerImage: g.images[repoTag],
			Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: moduleName, DirName: "/opt"},
		},
	}
	for _, f := range mutate {
		f(&cfg)
	}
	return cfg
}

// runWorker runs `worker <action>` for cfg on the real node (host root /, no dry run), prints its
// log and its result, and returns them.
func (g *guest) runWorker(step string, action contract.Action, cfg contract.Config) workerRun {
	var out workerRun
	if err := os.MkdirAll(runDir, 0o750); err != nil {
		out.err = err
		return out
	}
	cfgFile := filepath.Join(runDir, step+".json")
	resultFile := filepath.Join(runDir, step+".result")
	data, err := json.Marshal(cfg)
	if err == nil {
		err = os.WriteFile(cfgFile, data, 0o600)
	}
	if err != nil {
		out.err = err
		return out
	}
	g.r.info("%s: worker %s %s", step, action, data)
	ctx, cancel := context.WithTimeout(context.Background(), workerTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, vm.WorkerBinary, string(action), "--config", cfgFile, "--cache-dir", cacheDir, // #nosec G204 -- fixed binary, argv
		"--host-root", "/", "--termination-log", resultFile, "--modprobe", vm.Modprobe)
	var stderr bytes.Buffer
	cmd.Stdout = &bytes.Buffer{}
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	out.log = stderr.String()
	for line := range strings.SplitSeq(strings.TrimSpace(out.log), "\n") {
		fmt.Printf("worker[%s]: %s\n", step, line)
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		out.code = ee.ExitCode()
	case err != nil:
		out.err = err
		return out
	}
	g.r.info("%s: worker exited %d after %s", step, out.code, time.Since(start).Round(time.Millisecond))
	raw, err := os.ReadFile(resultFile)
	if err != nil {
		out.err = err
		return out
	}
	g.r.result(step, raw)
	out.res, out.err = contract.ParseResult(raw)
	return out
}

// checkRun checks that a run gave the wanted outcome (and reason, for failures), with the exit
// status that goes with it.
func (g *guest) checkRun(step string, run workerRun, outcome contract.Outcome, reason contract.Reason) bool {
	wantCode := 0
	if outcome == contract.OutcomeFailed {
		wantCode = 1
	}
	ok := run.err == nil && run.res.Outcome == outcome && run.res.Reason == reason && run.code == wantCode &&
		run.res.BootID == g.bootID
	return g.r.check(step, "outcome", ok, "outcome %q reason %q exit %d bootID %q (err %v); want %q %q exit %d bootID %q; message: %s",
		run.res.Outcome, run.res.Reason, run.code, run.res.BootID, run.err, outcome, reason, wantCode, g.bootID, run.res.Message)
}

// logMessages returns the "message" fields of the worker's JSON log lines, with the "stdout"
// field appended to those that have one.
func logMessages(log string) []string {
	var msgs []string
	for line := range strings.SplitSeq(log, "\n") {
		var entry struct {
			Message string `json:"message"`
			Stdout  string `json:"stdout"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Message != "" {
			msgs = append(msgs, strings.TrimSpace(entry.Message+" "+entry.Stdout))
		}
	}
	return msgs
}
