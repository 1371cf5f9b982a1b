package main

import (
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

var t0 = time.Date(2026, 7, 30, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d)) }

func TestAge(t *testing.T) {
	cases := map[string]struct {
		ago  time.Duration
		want string
	}{
		"now":                       {0, "0s"},
		"seconds":                   {45 * time.Second, "45s"},
		"minutes and second":        {3*time.Minute + 12*time.Second, "3m12s"},
		"ten minutes drops seconds": {10*time.Minute + 5*time.Second, "10m"},
		"hours":                     {5 * time.Hour, "5h"},
		"hours and minutes":         {5*time.Hour + 3*time.Minute, "5h3m"},
		"days":                      {75 * time.Hour, "3d3h"},
		"future is 0s":              {-time.Hour, "0s"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := age(t0.Add(-tc.ago), t0); got != tc.want {
				t.Errorf("age(%v ago) = %q, want %q", tc.ago, got, tc.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	cases := []struct {
		in   string
		n    int
		want string
	}{
		{"Loaded", 10, "Loaded"},
		{"Loaded", 6, "Loaded"},
		{"LoadBackOff", 6, "LoadB…"},
		{"worker failed: x", 8, "worker…"}, // no space before the ellipsis
		{"Absent → Loading", 9, "Absent →…"},
		{"abc", 1, "…"},
		{"abc", 0, ""},
	}
	for _, tc := range cases {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
		if runeLen(truncate(tc.in, tc.n)) > tc.n {
			t.Errorf("truncate(%q, %d) is longer than %d runes", tc.in, tc.n, tc.n)
		}
	}
}

func TestReasonCell(t *testing.T) {
	cases := map[string]struct {
		reason, message, want string
	}{
		"both":              {"SpecRemoved", "spec no longer wants the module", "SpecRemoved: spec no longer wants the module"},
		"message restates":  {"WorkerFailed", "worker failed (Busy): rmmod: Module nic is in use", "WorkerFailed (Busy): rmmod: Module nic is in use"},
		"reason only":       {"Pending", "", "Pending"},
		"message only":      {"", "something", "something"},
		"message is reason": {"WorkerFailed", "worker failed", "WorkerFailed: worker failed"},
	}
	for name, tc := range cases {
		if got := reasonCell(PairRow{Reason: tc.reason, Message: tc.message}); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine("modprobe: FATAL:\n  Module x\tin use\x1b"); got != "modprobe: FATAL: Module x in use" {
		t.Errorf("oneLine = %q", got)
	}
}

func TestNaturalLess(t *testing.T) {
	names := []string{"node-10", "node-2", "node-1", "infra", "node-02a", "node-1b", "gpu-3"}
	sort.Slice(names, func(i, j int) bool { return naturalLess(names[i], names[j]) })
	want := []string{"gpu-3", "infra", "node-1", "node-1b", "node-2", "node-02a", "node-10"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("sorted %v, want %v", names, want)
	}
}

func specEntry(ns, name, image, kernel string) kmmv1beta1.NodeModuleSpec {
	return kmmv1beta1.NodeModuleSpec{Namespace: ns, Name: name,
		Config: kmmv1beta1.ModuleConfig{KernelVersion: kernel, ContainerImage: image}}
}

func statusEntry(ns, name string, state kmmv1beta1.ModuleState, since time.Duration, reason, msg string) kmmv1beta1.NodeModuleStatus {
	return kmmv1beta1.NodeModuleStatus{Namespace: ns, Name: name, State: state, LastTransitionTime: at(since), Reason: reason, Message: msg}
}

func nmc(node string, spec []kmmv1beta1.NodeModuleSpec, status []kmmv1beta1.NodeModuleStatus) kmmv1beta1.NodeModulesConfig {
	n := kmmv1beta1.NodeModulesConfig{}
	n.Name, n.Spec.Modules, n.Status.Modules = node, spec, status
	return n
}

// fixture is a cluster of three nodes: node-10 has a failing load and an unload in progress,
// node-2 a loaded module, node-1 a spec entry the NMC controller has not acted on yet.
func fixture() []kmmv1beta1.NodeModulesConfig {
	loaded := statusEntry("drivers", "nic", kmmv1beta1.StateLoaded, -5*time.Hour, "WorkerSucceeded", "worker load succeeded")
	loaded.Config = &kmmv1beta1.ModuleConfig{KernelVersion: "6.1.0-56-cloud-amd64", ContainerImage: "reg.example.com/nic:a"}
	loaded.ImageDigest = "sha256:0123"
	failing := statusEntry("drivers", "nic", kmmv1beta1.StateLoadBackOff, -3*time.Minute-12*time.Second, "WorkerFailed",
		"worker failed (ImagePull): GET https://reg.example.com/v2/nic/manifests/a: UNAUTHORIZED: authentication required")
	failing.Attempts = 3
	unloading := statusEntry("gpu", "accel", kmmv1beta1.StateUnloading, -40*time.Second, "SpecRemoved", "spec no longer wants the module")
	unloading.Config = &kmmv1beta1.ModuleConfig{KernelVersion: "6.1.0-56-cloud-amd64", ContainerImage: "reg.example.com/accel:1"}
	return []kmmv1beta1.NodeModulesConfig{
		nmc("node-10", []kmmv1beta1.NodeModuleSpec{specEntry("drivers", "nic", "reg.example.com/nic:a", "6.1.0-56-cloud-amd64")},
			[]kmmv1beta1.NodeModuleStatus{unloading, failing}),
		nmc("node-2", []kmmv1beta1.NodeModuleSpec{specEntry("drivers", "nic", "reg.example.com/nic:a", "6.1.0-56-cloud-amd64")},
			[]kmmv1beta1.NodeModuleStatus{loaded}),
		nmc("node-1", []kmmv1beta1.NodeModuleSpec{specEntry("drivers", "nic", "reg.example.com/nic:a", "6.1.0-56-cloud-amd64")}, nil),
	}
}

func TestStatusRows(t *testing.T) {
	type brief struct{ node, module, state, age, reason string }
	cases := map[string]struct {
		filter moduleFilter
		want   []brief
	}{
		"all, by node then module": {want: []brief{
			{"node-1", "drivers/nic", "Absent", "", "Pending"},
			{"node-2", "drivers/nic", "Loaded", "5h", "WorkerSucceeded"},
			{"node-10", "drivers/nic", "LoadBackOff", "3m12s", "WorkerFailed"},
			{"node-10", "gpu/accel", "Unloading", "40s", "SpecRemoved"},
		}},
		"one module": {filter: moduleFilter{namespace: "gpu", name: "accel"}, want: []brief{
			{"node-10", "gpu/accel", "Unloading", "40s", "SpecRemoved"},
		}},
		"one namespace": {filter: moduleFilter{namespace: "drivers"}, want: []brief{
			{"node-1", "drivers/nic", "Absent", "", "Pending"},
			{"node-2", "drivers/nic", "Loaded", "5h", "WorkerSucceeded"},
			{"node-10", "drivers/nic", "LoadBackOff", "3m12s", "WorkerFailed"},
		}},
		"a module no node has": {filter: moduleFilter{namespace: "drivers", name: "other"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []brief
			for _, r := range statusRows(fixture(), tc.filter, t0) {
				got = append(got, brief{r.Node, r.Module, r.State, r.Age, r.Reason})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rows\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestStatusRowFields(t *testing.T) {
	rows := statusRows(fixture(), moduleFilter{}, t0)
	pending, loaded, unloading := rows[0], rows[1], rows[3]
	if pending.Since != nil || !pending.Desired || pending.Image != "reg.example.com/nic:a" || pending.LoadedImage != "" {
		t.Errorf("pending row %+v", pending)
	}
	if loaded.Since == nil || !loaded.Since.Equal(t0.Add(-5*time.Hour)) || loaded.ImageDigest != "sha256:0123" ||
		loaded.LoadedImage != "reg.example.com/nic:a" || loaded.Kernel != "6.1.0-56-cloud-amd64" {
		t.Errorf("loaded row %+v", loaded)
	}
	if unloading.Desired || unloading.Image != "" || unloading.LoadedImage != "reg.example.com/accel:1" || unloading.Kernel != "6.1.0-56-cloud-amd64" {
		t.Errorf("unloading row %+v", unloading)
	}
	if rows[2].Attempts != 3 {
		t.Errorf("attempts %d, want 3", rows[2].Attempts)
	}
}

func TestRenderStatus(t *testing.T) {
	summaries := []ModuleSummary{
		{Module: "drivers/nic", HasStatus: true, ReadyReason: "WorkerFailing", Loaded: 1, Desired: 3, Degraded: true,
			DegradedReason: "WorkerFailing", DegradedMessage: "worker failing on node-10 (worker failed (ImagePull): GET https://reg.example.com/v2/nic/manifests/a)"},
		{Module: "gpu/accel", Deleting: true, HasStatus: true, Ready: true, ReadyReason: "AllLoaded"},
	}
	got := renderStatus(summaries, statusRows(fixture(), moduleFilter{}, t0), 80, false)
	want := `drivers/nic: not Ready (WorkerFailing), loaded on 1/3 nodes; Degraded WorkerFai…
gpu/accel: Ready (AllLoaded), loaded on 0/0 nodes; being deleted (unloading)

NODE     MODULE       STATE        AGE    ATTEMPTS  REASON
node-1   drivers/nic  Absent       -      0         Pending: no status yet: the…
node-2   drivers/nic  Loaded       5h     0         WorkerSucceeded: worker loa…
node-10  drivers/nic  LoadBackOff  3m12s  3         WorkerFailed (ImagePull): G…
node-10  gpu/accel    Unloading    40s    0         SpecRemoved: spec no longer…
`
	if got != want {
		t.Errorf("status output\n%s\nwant\n%s", got, want)
	}
	for _, l := range strings.Split(got, "\n") {
		if runeLen(l) > 80 {
			t.Errorf("line of %d columns: %q", runeLen(l), l)
		}
	}
}

func TestRenderStatusWideKeepsEverything(t *testing.T) {
	got := renderStatus(nil, statusRows(fixture(), moduleFilter{}, t0), 80, true)
	for _, s := range []string{"KERNEL", "IMAGE", "UNAUTHORIZED: authentication required", "reg.example.com/accel:1", "6.1.0-56-cloud-amd64"} {
		if !strings.Contains(got, s) {
			t.Errorf("wide output lacks %q:\n%s", s, got)
		}
	}
	if strings.Contains(got, ellipsis) {
		t.Errorf("wide output truncates:\n%s", got)
	}
}

func TestRenderStatusCapsLongNamesAndKeepsRoomForTheReason(t *testing.T) {
	long := nmc(strings.Repeat("n", 60), []kmmv1beta1.NodeModuleSpec{specEntry(strings.Repeat("a", 30), strings.Repeat("b", 30), "img:1", "6.1")}, nil)
	got := renderStatus(nil, statusRows([]kmmv1beta1.NodeModulesConfig{long}, moduleFilter{}, t0), 80, false)
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], strings.Repeat("n", nodeCap-1)+ellipsis) ||
		!strings.Contains(lines[1], "Pending: no sta…") {
		t.Errorf("output\n%s", got)
	}
	if n := runeLen(lines[1]); n > nodeCap+moduleCap+len("Absent")+len("AGE")+len("ATTEMPTS")+minReason+5*len(columnGap) {
		t.Errorf("row of %d columns", n)
	}
}

func TestStatusJSONShape(t *testing.T) {
	rows := statusRows(fixture(), moduleFilter{}, t0)
	data, err := json.Marshal(rows)
	if err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	if err := json.Unmarshal(data, &objs); err != nil {
		t.Fatal(err)
	}
	wantKeys := []string{"age", "attempts", "desired", "image", "imageDigest", "kernel", "loadedImage", "message", "module",
		"name", "namespace", "node", "reason", "since", "state"}
	for i, o := range objs {
		var keys []string
		for k := range o {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !reflect.DeepEqual(keys, wantKeys) {
			t.Errorf("object %d has keys %v, want %v", i, keys, wantKeys)
		}
	}
	if objs[0]["since"] != nil || objs[1]["since"] != "2026-07-30T07:00:00Z" || objs[2]["attempts"] != float64(3) {
		t.Errorf("objects %v", objs[:3])
	}
}

func TestSummaryString(t *testing.T) {
	ready := kmmv1beta1.Module{}
	ready.Namespace, ready.Name = "drivers", "nic"
	ready.Status.ModuleLoader = kmmv1beta1.DaemonSetStatus{DesiredNumber: 3, AvailableNumber: 3}
	ready.Status.Conditions = []metav1.Condition{
		{Type: kmmv1beta1.ConditionReady, Status: metav1.ConditionTrue, Reason: kmmv1beta1.ReasonAllLoaded},
		{Type: kmmv1beta1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: kmmv1beta1.ReasonAsExpected},
	}
	degraded := *ready.DeepCopy()
	degraded.Status.ModuleLoader.AvailableNumber = 2
	degraded.Status.Conditions = []metav1.Condition{
		{Type: kmmv1beta1.ConditionReady, Status: metav1.ConditionFalse, Reason: kmmv1beta1.ReasonInProgress},
		{Type: kmmv1beta1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: kmmv1beta1.ReasonNoKernelMapping,
			Message: "no kernel mapping for the kernel of node-3"},
	}
	fresh := kmmv1beta1.Module{}
	fresh.Namespace, fresh.Name = "drivers", "new"
	cases := map[string]struct {
		m    kmmv1beta1.Module
		want string
	}{
		"ready":    {ready, "drivers/nic: Ready (AllLoaded), loaded on 3/3 nodes"},
		"degraded": {degraded, "drivers/nic: not Ready (InProgress), loaded on 2/3 nodes; Degraded NoKernelMapping: no kernel mapping for the kernel of node-3"},
		"new":      {fresh, "drivers/new: no status yet"},
	}
	for name, tc := range cases {
		if got := summarize(&tc.m).String(); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}

func historyFixture() *kmmv1beta1.NodeModulesConfig {
	nic := statusEntry("drivers", "nic", kmmv1beta1.StateLoaded, 0, "WorkerSucceeded", "")
	nic.Transitions = []kmmv1beta1.Transition{
		{Trigger: "SpecSet", From: "Absent", To: "Loading", Time: at(-10 * time.Second), Reason: "SpecSet"},
		{Trigger: "WorkerFailed", From: "Loading", To: "LoadBackOff", Time: at(-8 * time.Second), Reason: "WorkerFailed"},
		{Trigger: "BackOffExpired", From: "LoadBackOff", To: "Loading", Time: at(0), Reason: "BackOffExpired"},
		{Trigger: "WorkerSucceeded", From: "Loading", To: "Loaded", Time: at(0), Reason: "WorkerSucceeded"},
	}
	accel := statusEntry("gpu", "accel", kmmv1beta1.StateLoading, -9*time.Second, "SpecSet", "")
	accel.Transitions = []kmmv1beta1.Transition{{Trigger: "SpecSet", From: "Absent", To: "Loading", Time: at(-9 * time.Second), Reason: "SpecSet"}}
	n := nmc("node-1", nil, []kmmv1beta1.NodeModuleStatus{nic, accel})
	return &n
}

func TestHistoryRows(t *testing.T) {
	brief := func(rows []HistoryRow) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Module+" "+r.From+">"+r.To)
		}
		return out
	}
	all := brief(historyRows(historyFixture(), moduleFilter{}))
	want := []string{"drivers/nic Absent>Loading", "gpu/accel Absent>Loading", "drivers/nic Loading>LoadBackOff",
		"drivers/nic LoadBackOff>Loading", "drivers/nic Loading>Loaded"} // same second: the log's order
	if !reflect.DeepEqual(all, want) {
		t.Errorf("history\n got %v\nwant %v", all, want)
	}
	if got := brief(historyRows(historyFixture(), moduleFilter{namespace: "gpu", name: "accel"})); !reflect.DeepEqual(got, []string{"gpu/accel Absent>Loading"}) {
		t.Errorf("filtered history %v", got)
	}
}

func TestRenderHistory(t *testing.T) {
	got := renderHistory(historyRows(historyFixture(), moduleFilter{name: "nic"}), 80)
	want := `TIME                  MODULE       FROM → TO              TRIGGER          REASON
2026-07-30T11:59:50Z  drivers/nic  Absent → Loading       SpecSet          SpecSet
2026-07-30T11:59:52Z  drivers/nic  Loading → LoadBackOff  WorkerFailed     WorkerFailed
2026-07-30T12:00:00Z  drivers/nic  LoadBackOff → Loading  BackOffExpired   BackOffExpired
2026-07-30T12:00:00Z  drivers/nic  Loading → Loaded       WorkerSucceeded  WorkerSucceeded
`
	if got != want {
		t.Errorf("history output\n%s\nwant\n%s", got, want)
	}
}

func TestHistoryJSONShape(t *testing.T) {
	data, err := json.Marshal(historyRows(historyFixture(), moduleFilter{})[:1])
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"time":"2026-07-30T11:59:50Z","node":"node-1","module":"drivers/nic","namespace":"drivers","name":"nic",` +
		`"from":"Absent","to":"Loading","trigger":"SpecSet","reason":"SpecSet"}]`
	if string(data) != want {
		t.Errorf("JSON\n got %s\nwant %s", data, want)
	}
}

func TestRenderRollout(t *testing.T) {
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "nic"}}
	m.Spec.ModuleLoader = &kmmv1beta1.ModuleLoaderSpec{}
	m.Spec.ModuleLoader.Container.Version = "v2"
	if got := renderRollout(m, t0, 100); !strings.Contains(got, "no rollout status yet") {
		t.Fatalf("without status.rollout: %q", got)
	}
	since := at(-3 * time.Minute)
	m.Status.Rollout = &kmmv1beta1.RolloutStatus{Version: "v2", MaxUnavailable: 2, MaxFailed: 1,
		NodesByUpgradeState: map[kmmv1beta1.UpgradeState]int32{kmmv1beta1.Upgraded: 3, kmmv1beta1.UpgradeFailed: 1, kmmv1beta1.Upgrading: 1, kmmv1beta1.UpgradePending: 5},
		Paused:              &kmmv1beta1.RolloutPause{Reason: kmmv1beta1.ReasonFailureBudgetExceeded, Message: "1 of 10 nodes UpgradeFailed", Since: since},
		Nodes: []kmmv1beta1.RolloutNodeStatus{
			{Name: "node-4", State: kmmv1beta1.UpgradeFailed, PairState: kmmv1beta1.StateLoadBackOff, Reason: "ImagePull", Message: "manifest unknown", Since: &since},
			{Name: "node-5", State: kmmv1beta1.Upgrading, PairState: kmmv1beta1.StateUnloading, Since: &since},
		}}
	got := renderRollout(m, t0, 100)
	want := "drivers/nic: rolling out v2\n" +
		"PAUSED (FailureBudgetExceeded, 3m): 1 of 10 nodes UpgradeFailed\n" +
		"maxUnavailable 2, maxFailed 1 (1 failed)\n" +
		"Upgraded 3, Upgrading 1, UpgradeFailed 1, UpgradePending 5, UpgradeSkipped 0\n\n" +
		"NODE    UPGRADE STATE  PAIR STATE   AGE  REASON\n" +
		"node-4  UpgradeFailed  LoadBackOff  3m   ImagePull: manifest unknown\n" +
		"node-5  Upgrading      Unloading    3m   \n"
	if got != want {
		t.Fatalf("renderRollout:\n%s\nwant:\n%s", got, want)
	}
	m.Spec.UpgradePolicy = &kmmv1beta1.UpgradePolicy{Automatic: true, Canary: &kmmv1beta1.CanarySpec{SoakSeconds: 600}}
	soak := at(-4 * time.Minute)
	m.Status.Rollout = &kmmv1beta1.RolloutStatus{Version: "v2", MaxUnavailable: 1,
		NodesByUpgradeState: map[kmmv1beta1.UpgradeState]int32{kmmv1beta1.Upgraded: 1, kmmv1beta1.CanaryWaiting: 3, kmmv1beta1.RollingBack: 1},
		Canary:              &kmmv1beta1.CanaryStatus{Nodes: []string{"node-1"}, SoakStart: &soak},
		Previous:            &kmmv1beta1.PreviousVersion{Version: "v1", Configs: []kmmv1beta1.PreviousConfig{{}}},
		Rollback:            &kmmv1beta1.RolloutRollback{Version: "v1", Reason: kmmv1beta1.ReasonRollbackFailedNodes, Since: since, Nodes: []string{"node-4"}},
		Nodes:               []kmmv1beta1.RolloutNodeStatus{{Name: "node-4", State: kmmv1beta1.RollingBack, PairState: kmmv1beta1.StateUnloading, Since: &since}}}
	got = renderRollout(m, t0, 100)
	want = "drivers/nic: rolling out v2\n" +
		"ROLLING BACK to v1 (FailedNodes, 3m): the failed nodes node-4 go back (upgradePolicy.rollbackFailed) while the rollout is paused\n" +
		"maxUnavailable 1, maxFailed none (0 failed)\n" +
		"canary node-1: soaking since 4m (4m0s of 10m0s); the other nodes wait\n" +
		"previous version v1 (1 kernel configs kept for a rollback)\n" +
		"Upgraded 1, Upgrading 0, UpgradeFailed 0, UpgradePending 0, UpgradeSkipped 0, CanaryWaiting 3, RollingBack 1\n\n" +
		"NODE    UPGRADE STATE  PAIR STATE  AGE  REASON\n" +
		"node-4  RollingBack    Unloading   3m   \n"
	if got != want {
		t.Fatalf("renderRollout with a canary and a rollback:\n%s\nwant:\n%s", got, want)
	}
	m.Status.Rollout = &kmmv1beta1.RolloutStatus{Version: "v2", MaxUnavailable: 1,
		NodesByUpgradeState: map[kmmv1beta1.UpgradeState]int32{kmmv1beta1.Upgraded: 2, kmmv1beta1.UpgradeSkipped: 1}}
	if got := renderRollout(m, t0, 100); !strings.HasPrefix(got, "drivers/nic: complete v2\n") || !strings.Contains(got, "maxFailed none (0 failed)") {
		t.Fatalf("a complete rollout:\n%s", got)
	}
}
