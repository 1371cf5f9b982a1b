package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
)

// A takeover from upstream Kernel Module Management (docs/migration.md, issue 18) leaves objects kmm
// takes over here: NMC spec entries whose fields upstream's manager owns (spec.modules as one
// atomic list, in upstream's schema), upstream's NMC labels, its worker pods with their finalizer,
// and its finalizer on Modules. The decision about what is loaded is fsm's (fsm/adopt.go).

const (
	// UpstreamModuleFinalizer is upstream KMM's finalizer on Modules; kmm releases it with its own.
	UpstreamModuleFinalizer = "kmm.node.kubernetes.io/module-finalizer"
	// upstreamNMCLabelPrefix and the suffixes below are upstream's per-Module labels on NMCs.
	upstreamNMCLabelPrefix = "beta.kmm.node.kubernetes.io/"
	// takeoverManager is the field manager of the takeover patch. It owns the fields of an entry
	// the patch changed until the Module's apply owns them too, then releases them
	// (syncTakenOver); entries of a taken-over NMC are still removed by a patch.
	takeoverManager = "kmm-takeover"
	// TakenOverAnnotation marks an NMC a takeover patch rewrote (docs/migration.md).
	TakenOverAnnotation = "kmm.sigs.x-k8s.io/taken-over"
	// ReasonOrphanedEntryRemoved is the reason of the Event on an NMC whose spec entry of a Module
	// that does not exist the Module→NMC controller removed.
	ReasonOrphanedEntryRemoved = "OrphanedEntryRemoved"
)

var upstreamNMCLabelSuffixes = []string{".module-configured", ".module-in-use"}

// kmmManaged says whether a managedFields entry is kmm's own: a Module's apply, the takeover patch,
// or any status write (the status is rewritten whole by the NMC controller, so its ownership
// matters to no one).
func kmmManaged(mf metav1.ManagedFieldsEntry) bool {
	return mf.Subresource == "status" || mf.Manager == takeoverManager ||
		(strings.HasPrefix(mf.Manager, "kmm-module/") && mf.Operation == metav1.ManagedFieldsOperationApply)
}

// ownedBeyondKMM says whether someone else than kmm owns fields of the NMC's spec or metadata:
// upstream's manager after a takeover, or a "before-first-apply" the API server made of them.
func ownedBeyondKMM(nmc *kmmv1beta1.NodeModulesConfig) bool {
	if nmc == nil {
		return false
	}
	for _, mf := range nmc.ManagedFields {
		if !kmmManaged(mf) {
			return true
		}
	}
	return false
}

// upstreamNMCLabel says whether an NMC label is one of upstream's per-Module labels.
func upstreamNMCLabel(key string) bool {
	if !strings.HasPrefix(key, upstreamNMCLabelPrefix) {
		return false
	}
	for _, s := range upstreamNMCLabelSuffixes {
		if strings.HasSuffix(key, s) {
			return true
		}
	}
	return false
}

// needsTakeover says, from the cache (which strips managedFields), whether the Module's entry on
// nmc may not be kmm's yet: upstream KMM's record of the Module is still undecided, or upstream's
// labels for it are still on the NMC. takeOverNeeded then decides from the NMC as stored.
func needsTakeover(nmc *kmmv1beta1.NodeModulesConfig, m *kmmv1beta1.Module) bool {
	if nmc.SpecEntry(m.Namespace, m.Name) == nil {
		return false
	}
	if st := nmc.StatusEntry(m.Namespace, m.Name); st != nil && fsm.UpstreamRecord(st) {
		return true
	}
	for _, s := range upstreamNMCLabelSuffixes {
		if _, ok := nmc.Labels[upstreamNMCLabelPrefix+m.Namespace+"."+m.Name+s]; ok {
			return true
		}
	}
	return false
}

// takenOver says whether a takeover patch ever rewrote the NMC: some of its entries' fields may then
// be owned by other managers than their Module's, so entries are removed by a patch, not by apply.
func takenOver(nmc *kmmv1beta1.NodeModulesConfig) bool {
	return nmc != nil && nmc.Annotations[TakenOverAnnotation] != ""
}

// takeOverNeeded says, from the NMC as stored, whether the Module's entry needs the takeover patch:
// its manager did not apply it, or a manager other than kmm's still owns fields of the NMC (upstream's atomic
// ownership of spec.modules makes entry removals fail).
func takeOverNeeded(nmc *kmmv1beta1.NodeModulesConfig, m *kmmv1beta1.Module) bool {
	return !shared.AppliedBy(nmc, shared.FieldManager(m.Namespace, m.Name)) || ownedBeyondKMM(nmc)
}

// syncTakenOver writes the Module's entry (nil: removes it) on a node whose NMC may hold what
// upstream KMM left: it reads the NMC as stored (managedFields included), patches it when
// takeOverNeeded (or to remove an entry), then applies the entry so that its manager owns it, and
// releases what the takeover's field manager owns of the entry, so that the Module's apply owns it
// alone: a field the Module drops later then goes from the entry (co-owned, it stayed for good).
// On an NMC taken over before, the release comes first (it may have failed then), so that an apply
// that drops a field never finds it co-owned.
func (r *Reconciler) syncTakenOver(ctx context.Context, nodeName string, n *corev1.Node, m *kmmv1beta1.Module, e *kmmv1beta1.NodeModuleSpec) error {
	fresh := &kmmv1beta1.NodeModulesConfig{}
	if err := r.reader().Get(ctx, client.ObjectKey{Name: nodeName}, fresh); err != nil {
		return client.IgnoreNotFound(err)
	}
	if e != nil && !takeOverNeeded(fresh, m) {
		if err := r.releaseTakeover(ctx, fresh, m); err != nil {
			return err
		}
		return r.applyEntry(ctx, n, m, e)
	}
	if err := r.takeOver(ctx, fresh, m, e); err != nil {
		return err
	}
	if e == nil {
		return nil
	}
	if err := r.applyEntry(ctx, n, m, e); err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := r.reader().Get(ctx, client.ObjectKey{Name: nodeName}, fresh); err != nil {
			return client.IgnoreNotFound(err)
		}
		return r.releaseTakeover(ctx, fresh, m)
	})
}

// releaseTakeover removes the Module's entry from what the takeover's field manager owns of the NMC
// (as stored), once the Module's own manager applied it, with a resourceVersion-guarded patch of
// managedFields alone. Nothing to release: no write.
func (r *Reconciler) releaseTakeover(ctx context.Context, nmc *kmmv1beta1.NodeModulesConfig, m *kmmv1beta1.Module) error {
	managed, changed, err := releasedEntry(nmc, m.Namespace, m.Name)
	if err != nil || !changed {
		return err
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": nmc.ResourceVersion, "managedFields": managed}})
	if err != nil {
		return err
	}
	target := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: nmc.Name}}
	if err := r.Client.Patch(ctx, target, client.RawPatch(types.MergePatchType, data), client.FieldOwner(takeoverManager)); err != nil {
		return fmt.Errorf("releasing the takeover's ownership of the NMC entry of %s/%s on %s: %w", m.Namespace, m.Name, nmc.Name, err)
	}
	return nil
}

// releasedEntry is the NMC's managedFields with the (namespace, name) entry of spec.modules gone
// from the takeover manager's fields, and whether that changed anything: only once the Module's
// manager applied the entry (else no one would own what the takeover wrote).
func releasedEntry(nmc *kmmv1beta1.NodeModulesConfig, namespace, name string) ([]metav1.ManagedFieldsEntry, bool, error) {
	if !shared.AppliedBy(nmc, shared.FieldManager(namespace, name)) {
		return nil, false, nil
	}
	out := make([]metav1.ManagedFieldsEntry, 0, len(nmc.ManagedFields))
	changed := false
	for _, mf := range nmc.ManagedFields {
		if mf.Manager == takeoverManager && mf.Subresource == "" && mf.FieldsV1 != nil {
			raw, dropped, err := withoutEntry(mf.FieldsV1.GetRawBytes(), namespace, name)
			if err != nil {
				return nil, false, err
			}
			if dropped {
				mf.FieldsV1 = metav1.NewFieldsV1(string(raw))
				changed = true
			}
		}
		out = append(out, mf)
	}
	return out, changed, nil
}

// withoutEntry removes the (namespace, name) entry of spec.modules from a FieldsV1 set, and spec
// altogether when nothing of it is left; it says whether the entry was there.
func withoutEntry(raw []byte, namespace, name string) ([]byte, bool, error) {
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, false, fmt.Errorf("reading managedFields: %w", err)
	}
	spec, _ := fields["f:spec"].(map[string]any)
	modules, _ := spec["f:modules"].(map[string]any)
	dropped := false
	for k := range modules {
		var key struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		}
		if strings.HasPrefix(k, "k:") && json.Unmarshal([]byte(k[2:]), &key) == nil && key.Namespace == namespace && key.Name == name {
			delete(modules, k)
			dropped = true
		}
	}
	if !dropped {
		return raw, false, nil
	}
	if len(modules) == 0 {
		delete(spec, "f:modules")
	}
	if len(spec) == 0 {
		delete(fields, "f:spec")
	}
	out, err := json.Marshal(fields)
	return out, true, err
}

// takeOver rewrites the Module's entry on the NMC as kmm decided it (nil: removes it) with one JSON
// merge patch guarded by the resourceVersion, which also drops every managedFields entry not kmm's and
// upstream's NMC labels. A patch replaces the entry whole, so nothing upstream put in it stays (a
// server-side apply would leave fields no one owns); the Module's apply that follows takes
// ownership of the entry, so that its later applies, and its removal, work as for any kmm entry.
func (r *Reconciler) takeOver(ctx context.Context, nmc *kmmv1beta1.NodeModulesConfig, m *kmmv1beta1.Module, e *kmmv1beta1.NodeModuleSpec) error {
	modules := make([]kmmv1beta1.NodeModuleSpec, 0, len(nmc.Spec.Modules))
	for _, cur := range nmc.Spec.Modules {
		if cur.Namespace == m.Namespace && cur.Name == m.Name {
			if e != nil {
				modules = append(modules, *e)
			}
			continue
		}
		modules = append(modules, cur)
	}
	kept := []metav1.ManagedFieldsEntry{}
	for _, mf := range nmc.ManagedFields {
		if kmmManaged(mf) {
			kept = append(kept, mf)
		}
	}
	if !slices.ContainsFunc(kept, func(mf metav1.ManagedFieldsEntry) bool { return mf.Manager == takeoverManager }) {
		// The takeover's own entry, owning the annotation it sets: managedFields are never left
		// empty, else the next apply would give every field to a "before-first-apply" manager, and
		// an entry that manager co-owns would outlive its Module.
		now := metav1.Now()
		kept = append(kept, metav1.ManagedFieldsEntry{Manager: takeoverManager, Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: kmmv1beta1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{".":{},"f:` + TakenOverAnnotation + `":{}}}}`)})
	}
	labelPatch := map[string]any{}
	for k := range nmc.Labels {
		if upstreamNMCLabel(k) {
			labelPatch[k] = nil
		}
	}
	meta := map[string]any{"resourceVersion": nmc.ResourceVersion, "managedFields": kept,
		"annotations": map[string]any{TakenOverAnnotation: "true"}}
	if len(labelPatch) > 0 {
		meta["labels"] = labelPatch
	}
	data, err := json.Marshal(map[string]any{"metadata": meta, "spec": map[string]any{"modules": modules}})
	if err != nil {
		return err
	}
	target := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: nmc.Name}}
	if err := r.Client.Patch(ctx, target, client.RawPatch(types.MergePatchType, data), client.FieldOwner(takeoverManager)); err != nil {
		return fmt.Errorf("taking over the NMC entry of %s/%s on %s: %w", m.Namespace, m.Name, nmc.Name, err)
	}
	return nil
}

// removeOrphanedEntries handles a Module that does not exist (in the cache): the spec entries NMCs
// still have of it (orphaned: no reconcile of the Module will ever write them again) are removed
// once fsm.DecideOrphans says the grace is over, each by the takeover patch, with an Event on the
// NMC; the NMC controller then unloads the module there as for any removed entry.
func (r *Reconciler) removeOrphanedEntries(ctx context.Context, key types.NamespacedName) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("module", key.String())
	nmcs := &kmmv1beta1.NodeModulesConfigList{}
	if err := r.Client.List(ctx, nmcs); err != nil {
		return ctrl.Result{}, err
	}
	var found []*kmmv1beta1.NodeModulesConfig
	facts := fsm.OrphanFacts{Now: r.clock().Now(), Grace: r.OrphanGrace}
	for i := range nmcs.Items {
		if nmcs.Items[i].SpecEntry(key.Namespace, key.Name) != nil {
			found = append(found, &nmcs.Items[i])
			facts.Nodes = append(facts.Nodes, nmcs.Items[i].Name)
		}
	}
	if len(found) == 0 {
		r.orphans.forget(key)
		return ctrl.Result{}, nil
	}
	var first bool
	facts.Since, first = r.orphans.seen(key, facts.Now)
	d := fsm.DecideOrphans(facts)
	if !d.Remove {
		if first {
			log.Info("NMC spec entries of a Module that does not exist: removed after the grace unless it comes back",
				"nodes", facts.Nodes, "after", d.RequeueAfter)
		}
		return ctrl.Result{RequeueAfter: d.RequeueAfter}, nil
	}
	// The cache may lag a Module just created: the API server has the last word.
	m := &kmmv1beta1.Module{}
	if err := r.reader().Get(ctx, key, m); err == nil {
		r.orphans.forget(key)
		return ctrl.Result{}, nil
	} else if !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	m.Namespace, m.Name = key.Namespace, key.Name
	var errs []error
	for _, nmc := range found {
		if err := r.syncTakenOver(ctx, nmc.Name, nil, m, nil); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("Removed the NMC spec entry of a Module that does not exist", "node", nmc.Name)
		r.Recorder.Eventf(nmc, nil, corev1.EventTypeWarning, ReasonOrphanedEntryRemoved, "RemoveEntry",
			"removed the spec entry of %s: no such Module for %v (left by upstream KMM, or a Module deleted without kmm's finalizer); the module is unloaded from %s",
			key, facts.Now.Sub(facts.Since).Round(time.Second), nmc.Name)
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	r.orphans.forget(key)
	return ctrl.Result{}, nil
}

// orphanSeen remembers when this process first saw each Module's spec entries without the Module;
// an entry goes once they are removed or the Module is back.
type orphanSeen struct {
	mu sync.Mutex
	at map[types.NamespacedName]time.Time
}

// seen returns when key was first seen orphaned (now, and true, for the first time).
func (o *orphanSeen) seen(key types.NamespacedName, now time.Time) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t, ok := o.at[key]; ok {
		return t, false
	}
	if o.at == nil {
		o.at = map[types.NamespacedName]time.Time{}
	}
	o.at[key] = now
	return now, true
}

func (o *orphanSeen) forget(key types.NamespacedName) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.at, key)
}
