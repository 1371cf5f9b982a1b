// Package expectations remembers what a controller wrote until its informer cache shows it. A
// controller-runtime client reads from a cache that lags its own writes; a reconcile that runs in
// between would decide on the old object (start one more node than maxUnavailable allows, create a
// pod twice). The controller records each write it must not forget, overlays the unexpired records
// on what it gathered, and forgets a record once the cache shows it or its time-to-live passes (a
// write the cache never shows, because someone else changed the object again, must not be trusted
// forever). Each controller owns its store; nothing is shared between processes.
package expectations

import (
	"sync"
	"time"
)

// Store holds the expected values of keys written by one controller. The zero value is not usable:
// call New.
type Store[K comparable, V any] struct {
	mu     sync.Mutex
	ttl    time.Duration
	byKey  map[K]entry[V]
	pruned time.Time
}

type entry[V any] struct {
	value V
	at    time.Time
}

// New returns an empty store whose records expire ttl after they were written.
func New[K comparable, V any](ttl time.Duration) *Store[K, V] {
	return &Store[K, V]{ttl: ttl, byKey: map[K]entry[V]{}}
}

// Expect records that the controller wrote v under k at now.
func (s *Store[K, V]) Expect(k K, v V, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byKey[k] = entry[V]{value: v, at: now}
}

// Get returns the unexpired record of k.
func (s *Store[K, V]) Get(k K, now time.Time) (V, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byKey[k]
	if !ok || now.Sub(e.at) > s.ttl {
		var zero V
		return zero, false
	}
	return e.value, true
}

// Observed forgets the record of k when seen(value) says the cache now shows it.
func (s *Store[K, V]) Observed(k K, seen func(V) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byKey[k]; ok && seen(e.value) {
		delete(s.byKey, k)
	}
}

// Prune forgets the expired records, at most once per time-to-live (it is cheap to call on every
// reconcile).
func (s *Store[K, V]) Prune(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.pruned) <= s.ttl {
		return
	}
	s.pruned = now
	for k, e := range s.byKey {
		if now.Sub(e.at) > s.ttl {
			delete(s.byKey, k)
		}
	}
}

// Len is the number of records held, expired or not (for tests and metrics).
func (s *Store[K, V]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}
