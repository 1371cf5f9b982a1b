package scale

import (
	"bytes"
	"strings"
	"testing"
)

func TestCoresBusyCountsEveryProcessOverTheSettledTime(t *testing.T) {
	p := Phase{Name: "load", Seconds: 15, SettledSeconds: 20, CPUSeconds: 6,
		OtherCPUSeconds: map[string]float64{"kube-apiserver": 26, "etcd": 4, "harness+agent": 4}}
	if got := p.CoresBusy(); got != 2 {
		t.Errorf("CoresBusy = %v, want 2 (40 CPU s over 20 s)", got)
	}
	if got := (&Phase{CPUSeconds: 3}).CoresBusy(); got != 0 {
		t.Errorf("CoresBusy of a phase that took no time = %v, want 0", got)
	}
	r := &Result{Nodes: 10, Modules: 1, Pairs: 10, Machine: Machine{CPUs: 2}, Phases: []Phase{p}}
	var out bytes.Buffer
	r.PrintTable(&out)
	if !strings.Contains(out.String(), "harness+agent 4.0; 2.00 of 2 cores busy") {
		t.Errorf("the report does not say how busy the cores were:\n%s", out.String())
	}
}
