package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// reasonRemoved is the reason status -w shows for a pair whose NMC no longer has an entry for it
// (or that is gone with its NMC).
const reasonRemoved = "Removed"

// watchHooks are the integration test's view into status -w's watch requests.
type watchHooks struct {
	// timeout is the server-side timeout of each watch request (0: the server's default, 30-60 min).
	timeout time.Duration
	// opened is called each time a watch request is made.
	opened func()
}

// pairChanges is what status -w last printed for each pair, by node and module. Its size is the
// number of pairs the filter selects: bounded by the cluster, not by the time -w runs.
type pairChanges map[string]map[string]PairRow

// newPairChanges starts from the rows printed first.
func newPairChanges(rows []PairRow) pairChanges {
	c := pairChanges{}
	for _, r := range rows {
		if c[r.Node] == nil {
			c[r.Node] = map[string]PairRow{}
		}
		c[r.Node][r.Module] = r
	}
	return c
}

// update takes the rows of one node now (none when its NMC is gone) and returns the rows to print:
// pairs that are new, whose state, reason or transition time changed, and pairs that are gone
// (shown Absent, reason Removed), in the order of rows, then gone pairs by module.
func (c pairChanges) update(node string, rows []PairRow) []PairRow {
	before := c[node]
	now := make(map[string]PairRow, len(rows))
	var out []PairRow
	for _, r := range rows {
		now[r.Module] = r
		if old, ok := before[r.Module]; !ok || changed(old, r) {
			out = append(out, r)
		}
	}
	var gone []PairRow
	for m, old := range before {
		if _, ok := now[m]; !ok {
			gone = append(gone, removed(old))
		}
	}
	sortRows(gone)
	if len(now) == 0 {
		delete(c, node)
	} else {
		c[node] = now
	}
	return append(out, gone...)
}

// changed says whether a pair's row says something new: another state or reason, or a new
// transition (A → B → A between two reads).
func changed(old, cur PairRow) bool {
	return old.State != cur.State || old.Reason != cur.Reason || !timeEqual(old.Since, cur.Since)
}

func timeEqual(a, b *time.Time) bool {
	return (a == nil) == (b == nil) && (a == nil || a.Equal(*b))
}

// removed is the row of a pair whose entry is gone.
func removed(r PairRow) PairRow {
	return PairRow{Node: r.Node, Module: r.Module, Namespace: r.Namespace, Name: r.Name,
		State: string(kmmv1beta1.StateAbsent), Reason: reasonRemoved,
		Message: "no entry on the NMC any more", Kernel: r.Kernel}
}

// relistBackOff spaces the lists status -w makes after its watch expired.
var relistBackOff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 6, Cap: 30 * time.Second}

// relistPause is the pause before the next list after a watch that followed for `followed`: the
// back-off's next step, or its first again when the watch ran longer than the longest pause (the
// expiry then is the server's routine, not a loop of failing lists).
func relistPause(b *wait.Backoff, followed time.Duration) time.Duration {
	if followed > b.Cap {
		*b = relistBackOff
	}
	return b.Step()
}

// watchNMCs follows NodeModulesConfigs from resourceVersion rv until ctx ends: observe gets each
// NMC that changed (nil when deleted, by name). A watch the server closes is re-established from
// the last version seen (client-go's RetryWatcher); when that version has expired, it lists again
// (relist gets every NMC) and watches from there. It returns nil when ctx ends, or the error that
// makes following impossible (RBAC refusing the watch, no server).
func (s *session) watchNMCs(ctx context.Context, hooks *watchHooks, rv string,
	observe func(name string, nmc *kmmv1beta1.NodeModulesConfig) error,
	relist func(nmcs []kmmv1beta1.NodeModulesConfig) error) error {
	wc, err := client.NewWithWatch(s.config, client.Options{Scheme: pluginScheme()})
	if err != nil {
		return fmt.Errorf("creating a watch client: %w", err)
	}
	backOff := relistBackOff
	for {
		w := &nmcWatcher{client: wc, hooks: hooks}
		started := time.Now()
		err := w.follow(ctx, rv, observe)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		// The version we watched from has expired: list again, after a pause.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(relistPause(&backOff, time.Since(started))):
		}
		list := &kmmv1beta1.NodeModulesConfigList{}
		if err := s.client.List(ctx, list); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return explain(err, "listing NodeModulesConfigs")
		}
		if err := relist(list.Items); err != nil {
			return err
		}
		rv = list.ResourceVersion
	}
}

// nmcWatcher makes the watch requests of a RetryWatcher and remembers an error retrying cannot
// cure (the RetryWatcher itself would retry it forever).
type nmcWatcher struct {
	client client.WithWatch
	hooks  *watchHooks
	cancel context.CancelFunc

	mu    sync.Mutex
	fatal error
}

// WatchWithContext is one watch request.
func (w *nmcWatcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if w.hooks != nil {
		if w.hooks.timeout > 0 {
			opts.TimeoutSeconds = ptrTo(int64(w.hooks.timeout.Seconds()))
		}
		if w.hooks.opened != nil {
			w.hooks.opened()
		}
	}
	wi, err := w.client.Watch(ctx, &kmmv1beta1.NodeModulesConfigList{}, &client.ListOptions{Raw: &opts})
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsNotFound(err) {
		w.mu.Lock()
		w.fatal = explain(err, "watching NodeModulesConfigs")
		w.mu.Unlock()
		w.cancel()
	}
	return wi, err
}

func (w *nmcWatcher) fatalErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatal
}

// follow passes the events of one RetryWatcher to observe. It returns nil when the version
// expired (the caller lists again) or ctx ended, or the error that ends following.
func (w *nmcWatcher) follow(ctx context.Context, rv string, observe func(string, *kmmv1beta1.NodeModulesConfig) error) error {
	ctx, w.cancel = context.WithCancel(ctx)
	defer w.cancel()
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, w)
	if err != nil {
		return err
	}
	defer rw.Stop()
	for ev := range rw.ResultChan() {
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted:
			nmc, ok := ev.Object.(*kmmv1beta1.NodeModulesConfig)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted {
				err = observe(nmc.Name, nil)
			} else {
				err = observe(nmc.Name, nmc)
			}
			if err != nil {
				return err
			}
		case watch.Error:
			// The RetryWatcher ends after an error it cannot retry: the version expired.
			return w.fatalErr()
		}
	}
	return w.fatalErr()
}

func ptrTo[T any](v T) *T { return &v }
