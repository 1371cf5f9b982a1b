package module

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/internal/semantic"
)

// SpecWriters is how many NMC entries one Module reconcile applies at once: every apply is a
// round trip, and one Module may have thousands of nodes.
const SpecWriters = 16

// syncSpecs applies the Module's entry on each node whose decision changes it.
func (r *Reconciler) syncSpecs(ctx context.Context, s *moduleScope, log logr.Logger) error {
	var applies []func() error
	for i := range s.nodes {
		if write := r.entryWrite(ctx, s, &s.nodes[i], log); write != nil {
			applies = append(applies, write)
		}
	}
	return runConcurrently(applies, SpecWriters)
}

// entryWrite is the write of the Module's entry on node n its decision asks for (nil: none): by
// apply, or through syncTakenOver on an NMC that holds, or held, what upstream KMM left.
func (r *Reconciler) entryWrite(ctx context.Context, s *moduleScope, n *corev1.Node, log logr.Logger) func() error {
	d := s.decisions[n.Name]
	nmc := s.nmcs[n.Name]
	current := nmc.SpecEntry(s.module.Namespace, s.module.Name)
	changed := d.Action == fsm.SpecUpdate && (current == nil || !semantic.Equal(current, d.Entry))
	switch {
	case d.Action == fsm.SpecUpdate && needsTakeover(nmc, s.module):
		log.Info("Taking over an NMC spec entry upstream KMM wrote", "node", n.Name, "image", d.Entry.Config.ContainerImage)
		return func() error { return r.syncTakenOver(ctx, n.Name, n, s.module, d.Entry) }
	case d.Action == fsm.SpecDelete && current != nil && (needsTakeover(nmc, s.module) || takenOver(nmc)):
		log.Info("Removing NMC spec entry by patch (the NMC was taken over from upstream KMM)", "node", n.Name, "reason", d.Reason)
		return func() error { return r.syncTakenOver(ctx, n.Name, n, s.module, nil) }
	case changed && takenOver(nmc):
		// The takeover's field manager may still own fields of the entry: they are released
		// before the apply, so that a field the new entry drops goes (syncTakenOver).
		log.Info("Writing NMC spec entry (the NMC was taken over from upstream KMM)", "node", n.Name, "image", d.Entry.Config.ContainerImage)
		return func() error { return r.syncTakenOver(ctx, n.Name, n, s.module, d.Entry) }
	case changed:
		log.Info("Writing NMC spec entry", "node", n.Name, "image", d.Entry.Config.ContainerImage, "kernel", d.Entry.Config.KernelVersion)
		return func() error { return r.applyEntry(ctx, n, s.module, d.Entry) }
	case d.Action == fsm.SpecDelete && current != nil:
		log.Info("Removing NMC spec entry", "node", n.Name, "reason", d.Reason)
		return func() error { return r.applyEntry(ctx, n, s.module, nil) }
	}
	return nil
}

// runConcurrently runs fns, at most n at once, and joins their errors.
func runConcurrently(fns []func() error, n int) error {
	errs := make([]error, len(fns))
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, fn := range fns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// applyEntry server-side-applies the Module's entry (nil: none) to the node's NMC with a field
// manager of its own: spec.modules is a list-map keyed by namespace and name, so entries of other
// Modules are never touched, and applying no entry removes only this Module's.
func (r *Reconciler) applyEntry(ctx context.Context, node *corev1.Node, m *kmmv1beta1.Module, e *kmmv1beta1.NodeModuleSpec) error {
	modules := []any{}
	if e != nil {
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := json.Unmarshal(data, &obj); err != nil {
			return err
		}
		modules = append(modules, obj)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": kmmv1beta1.GroupVersion.String(),
		"kind":       "NodeModulesConfig",
		"metadata": map[string]any{
			"name": node.Name,
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Node", "name": node.Name, "uid": string(node.UID),
			}},
		},
		"spec": map[string]any{"modules": modules},
	}}
	owner := client.FieldOwner(shared.FieldManager(m.Namespace, m.Name))
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), owner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying the NMC entry of %s/%s on %s: %w", m.Namespace, m.Name, node.Name, err)
	}
	return nil
}
