package fsm

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// upstreamRecord is a status entry as upstream KMM leaves it: e's config (in upstream's spelling)
// loaded in boot, no state, no log.
func upstreamRecord(e *kmmv1beta1.NodeModuleSpec, boot string) kmmv1beta1.NodeModuleStatus {
	cfg := *e.Config.DeepCopy()
	cfg.ImagePullPolicy = corev1.PullIfNotPresent // upstream's default, spelled out
	cfg.InsecurePull = cfg.RegistryTLS.Insecure
	cfg.RegistryTLS = kmmv1beta1.TLSOptions{}
	cfg.Version, cfg.InTreeModulesToRemove = "", nil
	if len(e.Config.InTreeModulesToRemove) == 1 {
		cfg.InTreeModuleToRemove = e.Config.InTreeModulesToRemove[0]
	}
	return kmmv1beta1.NodeModuleStatus{Namespace: "ns", Name: "m", Config: &cfg, UpstreamBootID: boot,
		Version: e.Config.Version, LastTransitionTime: metav1.NewTime(t0.Add(-24 * time.Hour))}
}

func TestAdoption(t *testing.T) {
	spec := entry(k1, "reg/m:1", "v1")
	spec.Config.RegistryTLS.Insecure = true
	spec.Config.InTreeModulesToRemove = []string{"m_old"}
	other := entry(k1, "reg/m:2", "v1")
	cases := []struct {
		name    string
		spec    *kmmv1beta1.NodeModuleSpec
		record  kmmv1beta1.NodeModuleStatus
		node    Node
		kmmSpec bool
		podUp   bool
		dp      bool
		want    want
		trigger Trigger
	}{
		{name: "same config, same boot: adopted, no pod", spec: spec, record: upstreamRecord(spec, "b1"), node: readyNode(k1), kmmSpec: true,
			want: want{state: Loaded, ready: true}, trigger: Adopted},
		{name: "same config, NotReady node: adopted all the same (a record, no pod)", spec: spec, record: upstreamRecord(spec, "b1"),
			node: Node{KernelVersion: k1, BootID: "b1"}, kmmSpec: true, want: want{state: Loaded, ready: true}, trigger: Adopted},
		{name: "boot ID changed: reload", spec: spec, record: upstreamRecord(spec, "b0"), node: readyNode(k1), kmmSpec: true,
			want: want{state: Loading, create: contract.ActionLoad}, trigger: SpecSet},
		{name: "no boot ID recorded: load again (nothing proves it is loaded in this boot)", spec: spec, record: upstreamRecord(spec, ""),
			node: readyNode(k1), kmmSpec: true, want: want{state: Loading, create: contract.ActionLoad}, trigger: SpecSet},
		{name: "kernel changed: load for the new kernel", spec: entry(k2, "reg/m:1", "v1"), record: upstreamRecord(spec, "b1"), node: readyNode(k2), kmmSpec: true,
			want: want{state: Loading, create: contract.ActionLoad}, trigger: SpecSet},
		{name: "config differs: unload upstream's first", spec: other, record: upstreamRecord(spec, "b1"), node: readyNode(k1), kmmSpec: true,
			want: want{state: Unloading, create: contract.ActionUnload}, trigger: SpecSet},
		{name: "spec entry still upstream's: wait, record untouched", spec: spec, record: upstreamRecord(spec, "b1"), node: readyNode(k1),
			want: want{state: ""}},
		{name: "upstream worker pod still there: wait", spec: spec, record: upstreamRecord(spec, "b1"), node: readyNode(k1), kmmSpec: true, podUp: true,
			want: want{state: ""}},
		// Issue 18: a record of a Module kmm's spec does not have (deleted, or the node not selected,
		// before the takeover) is unloaded, not dropped with the module left in the kernel.
		{name: "no spec entry, loaded in this boot: unload", record: upstreamRecord(spec, "b1"), node: readyNode(k1),
			want: want{state: Unloading, create: contract.ActionUnload}, trigger: SpecRemoved},
		{name: "no spec entry, device plugin still on the node: drain it first", record: upstreamRecord(spec, "b1"), node: readyNode(k1), dp: true,
			want: want{state: DevicePluginDraining}, trigger: SpecRemoved},
		{name: "no spec entry, no boot ID recorded: unload (it may be loaded)", record: upstreamRecord(spec, ""), node: readyNode(k1),
			want: want{state: Unloading, create: contract.ActionUnload}, trigger: SpecRemoved},
		{name: "no spec entry, NotReady node: the record waits for the unload", record: upstreamRecord(spec, "b1"),
			node: Node{KernelVersion: k1, BootID: "b1"}, want: want{state: Absent}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := facts(c.spec, c.record, c.node)
			f.SpecWrittenByKMM, f.UpstreamWorkerPresent, f.DevicePluginRunning = c.kmmSpec, c.podUp, c.dp
			r := Step(f)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			if r.Status == nil || r.Status.State != c.want.state {
				t.Fatalf("status %+v, want state %q", r.Status, c.want.state)
			}
			if got := r.Plan.CreateWorker; (got == nil) != (c.want.create == "") || (got != nil && got.Action != c.want.create) {
				t.Errorf("worker %+v, want %q", got, c.want.create)
			}
			if r.Plan.Ready != c.want.ready {
				t.Errorf("ready %v, want %v", r.Plan.Ready, c.want.ready)
			}
			if c.trigger == "" && c.want.state == Absent {
				if len(r.Fired) != 0 || r.Status.Config == nil {
					t.Errorf("a stranded record on a NotReady node fired %v, record %+v", r.Fired, r.Status)
				}
				return
			}
			if c.trigger == "" {
				if len(r.Fired) != 0 || r.Plan.RequeueAfter != UpstreamWait || r.Status.UpstreamBootID == "" {
					t.Errorf("a waiting upstream record fired %v, requeue %v, record %+v", r.Fired, r.Plan.RequeueAfter, r.Status)
				}
				return
			}
			if len(r.Fired) == 0 || Trigger(r.Fired[0].Trigger) != c.trigger {
				t.Fatalf("fired %+v, want first %s", r.Fired, c.trigger)
			}
			if c.trigger == Adopted {
				st := r.Status
				if len(r.Fired) != 1 || len(st.Transitions) != 1 || st.Reason != string(Adopted) || st.BootID != "b1" || st.UpstreamBootID != "" ||
					!sameLoad(st.Config, &c.spec.Config) || st.Config.ImagePullPolicy != c.spec.Config.ImagePullPolicy || st.LastWorkerTime == nil {
					t.Errorf("adopted entry %+v, fired %+v", st, r.Fired)
				}
				// Adopted stays adopted: the next decision changes nothing.
				f2 := facts(c.spec, *st, c.node)
				if r2 := Step(f2); len(r2.Fired) != 0 || r2.Plan.CreateWorker != nil {
					t.Errorf("after adoption: fired %+v, plan %+v", r2.Fired, r2.Plan)
				}
			}
		})
	}
}

// TestUpstreamRecord: only an entry with a config, no state and no transition log is one upstream
// KMM left; whatever kmm wrote has a state (and every step of kmm's records a transition).
func TestUpstreamRecord(t *testing.T) {
	cfg := &entry(k1, "reg/m:1", "").Config
	cases := []struct {
		name string
		st   kmmv1beta1.NodeModuleStatus
		want bool
	}{
		{"upstream's: a config, no state, no log", upstreamRecord(entry(k1, "reg/m:1", ""), "b1"), true},
		{"kmm's: a state", kmmv1beta1.NodeModuleStatus{State: Loaded, Config: cfg}, false},
		{"kmm's, state lost: a transition log", kmmv1beta1.NodeModuleStatus{Config: cfg, Transitions: []kmmv1beta1.Transition{{From: Absent, To: Loading}}}, false},
		{"no config: nothing loaded to decide on", kmmv1beta1.NodeModuleStatus{}, false},
	}
	for _, c := range cases {
		if got := UpstreamRecord(&c.st); got != c.want {
			t.Errorf("%s: UpstreamRecord = %v, want %v", c.name, got, c.want)
		}
	}
}
