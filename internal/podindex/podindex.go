// Package podindex registers the cache index of kmm's pods by the node they are bound to
// (contract.PodNodeNameField). Every controller that lists pods by node registers it itself, so
// none depends on another having been set up first; registering twice on one manager is a no-op.
package podindex

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
)

// registered holds the field indexers the index was added to.
var registered sync.Map

// Register adds the pods-by-node index to indexer once.
func Register(ctx context.Context, indexer client.FieldIndexer) error {
	once, _ := registered.LoadOrStore(indexer, &sync.Once{})
	var err error
	once.(*sync.Once).Do(func() {
		err = indexer.IndexField(ctx, &corev1.Pod{}, contract.PodNodeNameField, func(o client.Object) []string {
			return []string{o.(*corev1.Pod).Spec.NodeName}
		})
	})
	if err != nil {
		registered.Delete(indexer) // let a later call try again
		return fmt.Errorf("indexing pods by node: %w", err)
	}
	return nil
}
