package podindex

import (
	"context"
	"errors"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// indexer refuses a second index of the same field, as the manager's cache does.
type indexer struct{ calls int }

func (i *indexer) IndexField(_ context.Context, _ client.Object, _ string, _ client.IndexerFunc) error {
	i.calls++
	if i.calls > 1 {
		return errors.New("indexer conflict")
	}
	return nil
}

func TestRegisterOncePerIndexer(t *testing.T) {
	a, b := &indexer{}, &indexer{}
	for range 3 {
		if err := Register(context.Background(), a); err != nil {
			t.Fatalf("registering again on the same indexer: %v", err)
		}
	}
	if err := Register(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if a.calls != 1 || b.calls != 1 {
		t.Fatalf("IndexField called %d and %d times, want once per indexer", a.calls, b.calls)
	}
}
