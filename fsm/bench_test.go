package fsm

import (
	"fmt"
	"strings"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// BenchmarkStepWorkerSucceeded is one decision plus one transition: a Loading pair whose load
// pod succeeded becomes Loaded.
func BenchmarkStepWorkerSucceeded(b *testing.B) {
	e := entry(k1, "r/m:v1", "")
	f := facts(e, kmmv1beta1.NodeModuleStatus{State: Loading}, readyNode(k1))
	f.Worker = Worker{Phase: PodSucceeded, Action: contract.ActionLoad, Entry: *e, Result: contract.Result{BootID: "b1"}}
	b.ReportAllocs()
	for b.Loop() {
		if r := Step(f); r.Status.State != Loaded {
			b.Fatal(r.Status.State)
		}
	}
}

// BenchmarkStepNoOp10Modules is the decision part of a no-op NMC reconcile: ten Loaded pairs,
// nothing changed.
func BenchmarkStepNoOp10Modules(b *testing.B) {
	var pairs []Facts
	for i := range 10 {
		e := entry(k1, fmt.Sprintf("r/m%d:v1", i), "")
		pairs = append(pairs, facts(e, loaded(Loaded, e), readyNode(k1)))
	}
	b.ReportAllocs()
	for b.Loop() {
		for i := range pairs {
			if r := Step(pairs[i]); len(r.Fired) != 0 {
				b.Fatal(r.Fired)
			}
		}
	}
}

// BenchmarkDecideSpec is one Module→NMC decision (regexp mapping, templated image).
func BenchmarkDecideSpec(b *testing.B) {
	m := testModule("")
	n := testNode("6.1.0-56-cloud-amd64", nil)
	b.ReportAllocs()
	for b.Loop() {
		if d := DecideSpec(m, n); d.Action != SpecUpdate {
			b.Fatal(d)
		}
	}
}

// BenchmarkDecideSpecHostile is the Module→NMC decision on what issue 13 found costly: a node
// reporting a 300 KB kernel version against a mapping that matches anything, and a mapping
// pattern of 2,000 repeated classes (refused by the bounds). Both must cost about as much as a
// normal decision (BenchmarkDecideSpec): they were 7.5 s of spec writes and 15.7 CPU-s before.
func BenchmarkDecideSpecHostile(b *testing.B) {
	cases := map[string]struct {
		kernel  string
		pattern string
	}{
		"300KB kernel string":   {strings.Repeat("a", 150_000) + strings.Repeat("1", 150_000), `^.+$`},
		"costly mapping regexp": {"6.1.0-56-cloud-amd64", `\pL{1000}\pN{1000}`},
	}
	for name, tc := range cases {
		b.Run(name, func(b *testing.B) {
			m := testModule("")
			m.Spec.ModuleLoader.Container.KernelMappings = []kmmv1beta1.KernelMapping{{Regexp: tc.pattern, ContainerImage: "reg.example.com/m:$KERNEL_FULL_VERSION"}}
			n := testNode(tc.kernel, nil)
			b.ReportAllocs()
			for b.Loop() {
				if d := DecideSpec(m, n); d.Action != SpecKeep {
					b.Fatalf("a hostile input got %s (%s)", d.Action, d.Reason)
				}
			}
		})
	}
}
