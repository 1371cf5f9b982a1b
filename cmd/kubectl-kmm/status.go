package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// reasonPending is the reason status shows for a pair that has a spec entry but no status entry
// yet (the NMC controller has not decided on it); its state is Absent, as the state machine counts it.
const reasonPending = "Pending"

// reasonUpstream is the reason status shows for a record upstream KMM left and kmm has not taken
// over yet.
const reasonUpstream = "UpstreamRecord"

// PairRow is one (node, module) pair as `status` shows it; `status -o json` prints a list of them.
// The JSON field names are a stable contract for scripts.
type PairRow struct {
	// Node is the node's (and its NodeModulesConfig's) name.
	Node string `json:"node"`
	// Module is "<namespace>/<name>" of the Module.
	Module    string `json:"module"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// State is the pair's state; a pair with a spec entry and no status entry yet is Absent with
	// reason Pending.
	State string `json:"state"`
	// Since is the status entry's lastTransitionTime (null when there is no status entry).
	Since *time.Time `json:"since"`
	// Age is the time from Since to now, as kubectl prints ages ("3m12s", "5h"); "" without Since.
	Age string `json:"age"`
	// Reason and Message explain the state.
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Attempts counts consecutive failed worker runs.
	Attempts int32 `json:"attempts"`
	// Desired says whether the NMC spec has an entry for the pair (the module should be loaded).
	Desired bool `json:"desired"`
	// Image is the kmod image the spec entry wants ("" without one); LoadedImage the one the status
	// records as loaded ("" when nothing is loaded), with its digest.
	Image       string `json:"image"`
	LoadedImage string `json:"loadedImage"`
	ImageDigest string `json:"imageDigest"`
	// Kernel is the kernel the spec entry (or else the loaded config) is for.
	Kernel string `json:"kernel"`
}

// moduleFilter selects pairs: by namespace and name, by namespace only (name ""), or all (both "").
type moduleFilter struct {
	namespace, name string
}

func (f moduleFilter) matches(namespace, name string) bool {
	return (f.namespace == "" || f.namespace == namespace) && (f.name == "" || f.name == name)
}

// statusRows turns NMCs into one row per (node, module) pair that has a spec or status entry,
// ordered by node (numbers in names compare as numbers) and then module.
func statusRows(nmcs []kmmv1beta1.NodeModulesConfig, filter moduleFilter, now time.Time) []PairRow {
	var rows []PairRow
	for i := range nmcs {
		rows = append(rows, nodeRows(&nmcs[i], filter, now)...)
	}
	sortRows(rows)
	return rows
}

// sortRows orders rows by node (numbers in names compare as numbers) and then module.
func sortRows(rows []PairRow) {
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Node != rows[j].Node {
			return naturalLess(rows[i].Node, rows[j].Node)
		}
		return rows[i].Module < rows[j].Module
	})
}

// nodeRows are the rows of one NMC.
func nodeRows(nmc *kmmv1beta1.NodeModulesConfig, filter moduleFilter, now time.Time) []PairRow {
	byKey := map[string]*PairRow{}
	var keys []string
	row := func(ns, name string) *PairRow {
		key := ns + "/" + name
		if r, ok := byKey[key]; ok {
			return r
		}
		r := &PairRow{Node: nmc.Name, Module: key, Namespace: ns, Name: name, State: string(kmmv1beta1.StateAbsent), Reason: reasonPending,
			Message: "no status yet: the NMC controller has not acted on the spec entry"}
		byKey[key] = r
		keys = append(keys, key)
		return r
	}
	for _, e := range nmc.Spec.Modules {
		if filter.matches(e.Namespace, e.Name) {
			r := row(e.Namespace, e.Name)
			r.Desired, r.Image, r.Kernel = true, e.Config.ContainerImage, e.Config.KernelVersion
		}
	}
	for i := range nmc.Status.Modules {
		if st := &nmc.Status.Modules[i]; filter.matches(st.Namespace, st.Name) {
			fillStatus(row(st.Namespace, st.Name), st, now)
		}
	}
	out := make([]PairRow, 0, len(keys))
	for _, k := range keys {
		out = append(out, *byKey[k])
	}
	return out
}

func fillStatus(r *PairRow, st *kmmv1beta1.NodeModuleStatus, now time.Time) {
	r.State, r.Reason, r.Message, r.Attempts = string(st.State), st.Reason, st.Message, st.Attempts
	if st.State == "" {
		// A record upstream KMM left that kmm has not taken over yet (docs/migration.md); once it
		// has, the pair shows Loaded with reason Adopted, or the state the normal rules gave it.
		r.State, r.Reason, r.Message = string(kmmv1beta1.StateAbsent), reasonUpstream, "recorded by upstream KMM, not taken over yet"
	}
	if !st.LastTransitionTime.IsZero() {
		t := st.LastTransitionTime.UTC()
		r.Since, r.Age = &t, age(t, now)
	}
	if st.Config != nil {
		r.LoadedImage, r.ImageDigest = st.Config.ContainerImage, st.ImageDigest
		if r.Kernel == "" {
			r.Kernel = st.Config.KernelVersion
		}
	}
}

// age is how long ago t was, as kubectl prints ages; a time in the future (clock skew) is "0s".
func age(t, now time.Time) string {
	return duration.HumanDuration(max(now.Sub(t), 0))
}

// naturalLess orders strings with digit runs compared as numbers: node-2 before node-10.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := leadingDigits(a), leadingDigits(b)
		if da != "" && db != "" {
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

// ModuleSummary is the one-line view of a Module's status that `status` prints above the table.
type ModuleSummary struct {
	Module          string
	Deleting        bool
	HasStatus       bool
	Ready           bool
	ReadyReason     string
	Loaded, Desired int32
	Degraded        bool
	DegradedReason  string
	DegradedMessage string
	// RolloutPaused is the reason its automatic rollout is paused ("" when it is not), of version
	// RolloutVersion.
	RolloutPaused, RolloutVersion string
}

// summarize reads a Module's status.
func summarize(m *kmmv1beta1.Module) ModuleSummary {
	s := ModuleSummary{
		Module:   m.Namespace + "/" + m.Name,
		Deleting: !m.DeletionTimestamp.IsZero(),
		Loaded:   m.Status.ModuleLoader.AvailableNumber,
		Desired:  m.Status.ModuleLoader.DesiredNumber,
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionReady); c != nil {
		s.HasStatus, s.Ready, s.ReadyReason = true, c.Status == metav1.ConditionTrue, c.Reason
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionDegraded); c != nil && c.Status == metav1.ConditionTrue {
		s.Degraded, s.DegradedReason, s.DegradedMessage = true, c.Reason, c.Message
	}
	if r := m.Status.Rollout; r != nil && r.Paused != nil {
		s.RolloutPaused, s.RolloutVersion = r.Paused.Reason, r.Version
	}
	return s
}

// String is the summary line, for example
// "drivers/nic: Ready (AllLoaded), loaded on 3/3 nodes" or
// "drivers/nic: not Ready (WorkerFailing), loaded on 2/3 nodes; Degraded WorkerFailing: worker failing on n1 (...)".
func (s ModuleSummary) String() string {
	var b strings.Builder
	b.WriteString(s.Module + ": ")
	switch {
	case !s.HasStatus:
		b.WriteString("no status yet")
	case s.Ready:
		fmt.Fprintf(&b, "Ready (%s), loaded on %d/%d nodes", s.ReadyReason, s.Loaded, s.Desired)
	default:
		fmt.Fprintf(&b, "not Ready (%s), loaded on %d/%d nodes", s.ReadyReason, s.Loaded, s.Desired)
	}
	if s.Deleting {
		b.WriteString("; being deleted (unloading)")
	}
	if s.RolloutPaused != "" {
		fmt.Fprintf(&b, "; rollout of %s paused (%s)", s.RolloutVersion, s.RolloutPaused)
	}
	if s.Degraded {
		fmt.Fprintf(&b, "; Degraded %s: %s", s.DegradedReason, s.DegradedMessage)
	}
	return b.String()
}

// Caps of the status table's columns, chosen so that a typical row fits 80 columns.
const (
	nodeCap   = 28
	moduleCap = 36
	minReason = 16
)

// renderStatus prints the Module summaries, a blank line, and the pair table, fitting width
// columns (0: no limit). Wide output adds the image and never truncates.
func renderStatus(summaries []ModuleSummary, rows []PairRow, width int, wide bool) string {
	var b strings.Builder
	b.WriteString(renderSummaries(summaries, width, wide))
	if len(summaries) > 0 {
		b.WriteString("\n")
	}
	_ = statusTable(rows, width, wide).write(&b) // a strings.Builder does not fail
	return b.String()
}

// renderSummaries prints one line per Module, cut to width unless wide.
func renderSummaries(summaries []ModuleSummary, width int, wide bool) string {
	var b strings.Builder
	for _, s := range summaries {
		line := oneLine(s.String())
		if width > 0 && !wide {
			line = truncate(line, width)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func statusTable(rows []PairRow, width int, wide bool) *table {
	t := &table{headers: []string{"NODE", "MODULE", "STATE", "AGE", "ATTEMPTS", "REASON"},
		caps: []int{nodeCap, moduleCap}, width: width, minLast: minReason}
	if wide {
		t = &table{headers: []string{"NODE", "MODULE", "STATE", "AGE", "ATTEMPTS", "KERNEL", "IMAGE", "REASON"}}
	}
	for _, r := range rows {
		cells := []string{r.Node, r.Module, r.State, dash(r.Age), fmt.Sprint(r.Attempts)}
		if wide {
			cells = append(cells, dash(r.Kernel), dash(imageCell(r)))
		}
		t.add(append(cells, dash(reasonCell(r)))...)
	}
	return t
}

// reasonCell is "Reason: message", or whichever of the two is set. A message that starts by
// restating the reason ("WorkerFailed", "worker failed ...") is not repeated, so that what follows
// survives truncation. For a failure the reason is its class: "ImagePull: pulling ...".
func reasonCell(r PairRow) string {
	switch {
	case r.Reason == "":
		return r.Message
	case r.Message == "":
		return r.Reason
	}
	if words := camelWords(r.Reason) + " "; len(r.Message) > len(words) && strings.EqualFold(r.Message[:len(words)], words) {
		return r.Reason + " " + r.Message[len(words):]
	}
	return r.Reason + ": " + r.Message
}

// camelWords spells a CamelCase reason as lower-case words: "WorkerFailed" → "worker failed".
func camelWords(s string) string {
	var b strings.Builder
	for i, c := range s {
		if c >= 'A' && c <= 'Z' {
			if i > 0 {
				b.WriteByte(' ')
			}
			c += 'a' - 'A'
		}
		b.WriteRune(c)
	}
	return b.String()
}

// imageCell is the wanted image, "loaded → wanted" when another one is loaded, or the loaded one
// when the spec wants nothing.
func imageCell(r PairRow) string {
	switch {
	case r.Image == "":
		return r.LoadedImage
	case r.LoadedImage != "" && r.LoadedImage != r.Image:
		return r.LoadedImage + " → " + r.Image
	}
	return r.Image
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
