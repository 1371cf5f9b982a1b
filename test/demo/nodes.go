package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/agent"
)

// startNodes starts the agent with one sandbox per node and adds the nodes.
func (d *demo) startNodes(ctx context.Context) error {
	ag, err := agent.New(d.env.Config, agent.Options{Outcome: d.runWorker})
	if err != nil {
		return err
	}
	d.agent = ag
	go func() { _ = ag.Start(ctx) }()
	for i := range d.o.Nodes {
		n := fmt.Sprintf("node-%d", i)
		if err := os.MkdirAll(filepath.Join(d.sandboxes, n, "proc/sys/kernel/random"), 0o750); err != nil {
			return err
		}
		if err := ag.AddNode(ctx, n, KernelA, map[string]string{"kmm-demo": "true"}); err != nil {
			return err
		}
		d.nodes = append(d.nodes, n)
	}
	d.sayf("Started %d simulated nodes on kernel %s; their worker pods run the real worker binary (--dry-run) in %s", d.o.Nodes, KernelA, d.sandboxes)
	return nil
}

// runWorker is the agent's outcome: it runs the real worker binary for the pod, in dry-run mode
// against the node's sandbox, and reports what the worker reported.
func (d *demo) runWorker(in agent.RunInput) agent.Verdict {
	sandbox := filepath.Join(d.sandboxes, in.Node)
	if err := os.WriteFile(filepath.Join(sandbox, "proc/sys/kernel/random/boot_id"), []byte(in.BootID+"\n"), 0o600); err != nil {
		return agent.Failed(contract.ReasonOther, err.Error())
	}
	cfg, err := json.Marshal(in.Config)
	if err != nil {
		return agent.Failed(contract.ReasonOther, err.Error())
	}
	cfgFile, resFile := filepath.Join(sandbox, "config.json"), filepath.Join(sandbox, "result.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		return agent.Failed(contract.ReasonOther, err.Error())
	}
	_ = os.Remove(resFile)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.o.WorkerBinary, string(in.Action), "--config", cfgFile, "--dry-run", //nolint:gosec // G204: the demo runs its own worker binary
		"--host-root", sandbox, "--cache-dir", filepath.Join(sandbox, "cache"), "--termination-log", resFile, "--log-level", "error")
	out, runErr := cmd.CombinedOutput()
	data, err := os.ReadFile(resFile)
	if err != nil {
		return agent.Failed(contract.ReasonOther, fmt.Sprintf("the worker wrote no result (%v): %s", runErr, out))
	}
	res, err := contract.ParseResult(data)
	if err != nil {
		return agent.Failed(contract.ReasonOther, err.Error())
	}
	return agent.Verdict{Outcome: res.Outcome, Reason: res.Reason, Message: res.Message, Stderr: res.Stderr, ImageDigest: res.ImageDigest}
}

// kubectlKMM runs the plugin against the demo cluster and returns its output.
func (d *demo) kubectlKMM(ctx context.Context, args ...string) (string, error) {
	args = append(args, "--kubeconfig", d.kubeconfig)
	out, err := exec.CommandContext(ctx, d.o.KubectlKMM, args...).CombinedOutput() //nolint:gosec // G204: the demo runs its own plugin binary
	if err != nil {
		return "", fmt.Errorf("kubectl kmm %v: %w: %s", args, err, out)
	}
	return string(out), nil
}

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }
