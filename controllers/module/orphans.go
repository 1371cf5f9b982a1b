package module

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

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
