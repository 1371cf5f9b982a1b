package fsm

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// claimHeld is one ResourceClaim allocated on the node with the Module's DRA driver's devices.
var claimHeld = []string{"app/gpu-claim"}

// TestClaimsHoldTheUnload: an allocated ResourceClaim of the Module's DRA driver keeps a pair that
// must unload in DevicePluginDraining, with its ready label (the driver's DaemonSet selects it),
// says so once in the status reason and message, creates no unload worker, and lets the unload go
// on once the claim is released and the driver pod is gone.
func TestClaimsHoldTheUnload(t *testing.T) {
	v1 := entry(k1, "r/m:v1", "v1")
	cases := []struct {
		name  string
		facts func() Facts
	}{
		{"spec removed, driver pod running", func() Facts {
			f := facts(nil, loaded(Loaded, v1), readyNode(k1))
			f.DevicePluginRunning, f.DevicePluginConfigured = true, true
			return f
		}},
		{"spec removed, no driver pod (crashed): still no unload", func() Facts {
			f := facts(nil, loaded(Loaded, v1), readyNode(k1))
			f.DevicePluginConfigured = true
			return f
		}},
		{"upgrade requested", func() Facts {
			n := readyNode(k1)
			n.UpgradeTarget = "v2"
			f := facts(v1, loaded(Loaded, v1), n)
			f.DevicePluginRunning, f.DevicePluginConfigured = true, true
			return f
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.facts()
			f.Claims = claimHeld
			r := check(t, f, want{state: DevicePluginDraining, ready: true})
			if r.Status.Reason != string(ClaimsAllocated) || !strings.Contains(r.Status.Message, "app/gpu-claim") {
				t.Fatalf("reason %q message %q: want ClaimsAllocated naming the claim", r.Status.Reason, r.Status.Message)
			}
			// Said once: the next step with the same facts fires nothing.
			f.Status = *r.Status
			again := check(t, f, want{state: DevicePluginDraining, ready: true})
			if len(again.Fired) != 0 {
				t.Fatalf("fired %v again while the claim stays", again.Fired)
			}
			// Released: the ready label goes (the driver leaves), then the unload.
			f.Claims = nil
			if f.Node.UpgradeTarget != "" {
				f.Spec = nil // the version label controller took the worker-pod label away
			}
			if f.DevicePluginRunning {
				r = check(t, f, want{state: DevicePluginDraining})
				f.Status, f.DevicePluginRunning = *r.Status, false
			}
			check(t, f, want{state: Unloading, create: contract.ActionUnload})
		})
	}
}

// TestClaimsStopAReload: an image bump under an allocated claim is no reload in place: it drains.
func TestClaimsStopAReload(t *testing.T) {
	old, next := entry(k1, "r/m:1", ""), entry(k1, "r/m:2", "")
	f := facts(next, loaded(Loaded, old), readyNode(k1))
	f.DevicePluginConfigured = true
	if r := Step(f); r.Status.State != Loading || r.Plan.CreateWorker == nil || r.Plan.CreateWorker.Action != contract.ActionReload {
		t.Fatalf("without a claim the bump should be a reload in place")
	}
	f.Claims = claimHeld
	check(t, f, want{state: DevicePluginDraining, ready: true})
}

// TestClaimsKeepTheDriverThroughAFlap: a Ready transition after the last worker run has the loaded
// config loaded again (seed 000's rule 5); with a claim of the DRA driver allocated on the node the
// ready label, which its DaemonSet selects, stays through that load (the module stays in the
// kernel), without a claim it goes as for a device plugin, and after a reboot (a new boot ID) it
// goes whatever the claims: the kernel lost the module.
func TestClaimsKeepTheDriverThroughAFlap(t *testing.T) {
	e := entry(k1, "r/m:1", "")
	for _, tc := range []struct {
		name            string
		claims          []string
		bootID          string
		wantReady, read bool
	}{
		{"a claim, same boot", claimHeld, "b1", true, true},
		{"no claim", nil, "b1", false, true},
		{"a claim, rebooted", claimHeld, "b2", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := readyNode(k1)
			n.ReadySince, n.BootID = t0.Add(-time.Second), tc.bootID // after the last worker run
			f := facts(e, loaded(Loaded, e), n)
			f.DevicePluginRunning, f.DevicePluginConfigured = true, true
			if f.MayUnload() != tc.read {
				t.Fatalf("MayUnload %v: the reconciler would not read the claims", f.MayUnload())
			}
			f.Claims = tc.claims
			r := check(t, f, want{state: Loading, create: contract.ActionLoad, ready: tc.wantReady})
			// The next reconcile, the load pod running: the same.
			f.Status, f.Worker = *r.Status, Worker{Phase: PodRunning, Action: contract.ActionLoad, Entry: *e, EntryKnown: true, Created: t0}
			if !f.MayUnload() {
				f.Claims = nil // not read (after a reboot no config is recorded any more)
			}
			check(t, f, want{state: Loading, ready: tc.wantReady})
		})
	}
}

// TestUnloadWorkerWaitsForClaims: an Unloading pair (entered before the claim was seen) makes no
// unload worker while a claim is allocated.
func TestUnloadWorkerWaitsForClaims(t *testing.T) {
	f := facts(nil, loaded(Unloading, entry(k1, "r/m:1", "")), readyNode(k1))
	f.Claims = claimHeld
	r := check(t, f, want{state: Unloading})
	if !strings.Contains(r.Plan.Waiting, "app/gpu-claim") {
		t.Fatalf("waiting %q: want the claim named", r.Plan.Waiting)
	}
	f.Claims = nil
	check(t, f, want{state: Unloading, create: contract.ActionUnload})
}

// TestDrainEvictsOwnDRADriverLast: the draining Module's own DRA driver pod is not spared (kmm's
// pod, a DaemonSet's) but evicted only once the other workloads are gone and no claim is left.
func TestDrainEvictsOwnDRADriverLast(t *testing.T) {
	driver := WorkloadPod{Namespace: "ns", Name: "m-dra-x", CreatedByKMM: true, DaemonSet: true, OwnDRADriver: true}
	otherKMM := WorkloadPod{Namespace: "ns", Name: "other-dra", CreatedByKMM: true, DaemonSet: true}
	if driver.Spared() != "" || otherKMM.Spared() == "" {
		t.Fatalf("spared: own driver %q, another Module's kmm pod %q", driver.Spared(), otherKMM.Spared())
	}
	evicted := func(f Facts) []string {
		var out []string
		if d := Step(f).Plan.Drain; d != nil {
			for _, w := range d.Evict {
				out = append(out, w.Name)
			}
		}
		return out
	}
	f := drainingFacts(10*time.Second, policy, plain, driver, otherKMM)
	f.DevicePluginRunning = true
	if got := evicted(f); len(got) != 1 || got[0] != "plain" {
		t.Fatalf("with a workload left evicted %v, want only plain", got)
	}
	f = drainingFacts(10*time.Second, policy, driver)
	f.DevicePluginRunning, f.Claims = true, claimHeld
	if got := evicted(f); len(got) != 0 {
		t.Fatalf("under a claim evicted %v, want nothing", got)
	}
	f.Claims = nil
	if got := evicted(f); len(got) != 1 || got[0] != driver.Name {
		t.Fatalf("once alone and no claim evicted %v, want the driver", got)
	}
	if Step(f).Plan.Ready {
		t.Fatalf("the ready label stays while the driver is evicted: its DaemonSet would bring it back")
	}
}

// TestDRAReadyLabel: the dra-ready label follows a Ready DRA driver pod where the module is loaded.
func TestDRAReadyLabel(t *testing.T) {
	r := Step(facts(entry(k1, "r/m:1", ""), loaded(Loaded, entry(k1, "r/m:1", "")), readyNode(k1)))
	key := kmmv1beta1.DRAReadyLabel("ns", "m")
	got := NodeLabels(LabelFacts{Labels: map[string]string{}, Modules: map[string]bool{"ns/m": true},
		Pairs: []LabelPair{{Key: "ns/m", Result: &r, DRAReady: true}}})
	if _, ok := got.Set[key]; !ok {
		t.Fatalf("labels %v: want %s", got.Set, key)
	}
	got = NodeLabels(LabelFacts{Labels: map[string]string{key: ""}, Modules: map[string]bool{"ns/m": true},
		Pairs: []LabelPair{{Key: "ns/m", Result: &r}}})
	if len(got.Remove) != 1 || got.Remove[0] != key {
		t.Fatalf("remove %v: want %s once the driver is not Ready", got.Remove, key)
	}
}

// TestClaimHoldsNode: which allocated ResourceClaims hold a node back.
func TestClaimHoldsNode(t *testing.T) {
	claim := func(driver string, sel *corev1.NodeSelector) *resourcev1.ResourceClaim {
		c := &resourcev1.ResourceClaim{}
		c.Status.Allocation = &resourcev1.AllocationResult{NodeSelector: sel,
			Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{Request: "r", Driver: driver, Pool: "p", Device: "d"}}}}
		return c
	}
	byName := func(op corev1.NodeSelectorOperator, names ...string) *corev1.NodeSelector {
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: op, Values: names}}}}}
	}
	byLabel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "rack", Operator: corev1.NodeSelectorOpIn, Values: []string{"r1"}}}}}}
	labels := map[string]string{"rack": "r1"}
	cases := []struct {
		name string
		c    *resourcev1.ResourceClaim
		want bool
	}{
		{"allocated on the node with the driver", claim("gpu.example.com", byName(corev1.NodeSelectorOpIn, "n1")), true},
		{"another node", claim("gpu.example.com", byName(corev1.NodeSelectorOpIn, "n2")), false},
		{"another driver", claim("nic.example.com", byName(corev1.NodeSelectorOpIn, "n1")), false},
		{"by node label", claim("gpu.example.com", byLabel), true},
		{"NotIn another node", claim("gpu.example.com", byName(corev1.NodeSelectorOpNotIn, "n2")), true},
		{"not node-local", claim("gpu.example.com", nil), false},
		{"not allocated", &resourcev1.ResourceClaim{}, false},
	}
	for _, tc := range cases {
		if got := ClaimHoldsNode(tc.c, "gpu.example.com", "n1", labels); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
