package node

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/controllers/shared"
)

// WorkerRegistryOptions say which registry configuration worker pods pull with: the operator's
// one definition, shared with the build and sign pods (controllers/shared.RegistryOptions).
type WorkerRegistryOptions = shared.RegistryOptions

// MaxServiceAccountPullSecrets caps the service account's imagePullSecrets a worker pod mounts.
const MaxServiceAccountPullSecrets = shared.MaxServiceAccountPullSecrets

// SAPullSecretsTTL is how long the NMC controller reuses a service account's imagePullSecrets
// for the worker pods it creates: a secret added to (or removed from) the service account reaches
// the worker pods created at most this long after the change. Without it every worker pod create
// read the service account once more (issue 22: a GET per pair, 1,000 in a 1,000-node load).
const SAPullSecretsTTL = 30 * time.Second

// saPullSecretsCacheSize bounds the service accounts remembered at once (the least recently used
// go first); a load touches one per Module.
const saPullSecretsCacheSize = 256

// saPullSecretsCache remembers shared.ServiceAccountPullSecrets' answers for SAPullSecretsTTL. Errors are
// not remembered, and concurrent misses for one service account share one read.
type saPullSecretsCache struct {
	once  sync.Once
	lru   *cache.LRUExpireCache
	reads singleflight.Group
}

// get is shared.ServiceAccountPullSecrets(ctx, c, namespace, name), from memory when read less than
// SAPullSecretsTTL ago by this process. clk is the reconciler's clock (nil: the real one), read on
// first use.
func (s *saPullSecretsCache) get(ctx context.Context, c client.Reader, clk clock.PassiveClock, namespace, name string) ([]string, error) {
	if c == nil {
		return nil, nil
	}
	s.once.Do(func() {
		if clk == nil {
			clk = clock.RealClock{}
		}
		s.lru = cache.NewLRUExpireCacheWithClock(saPullSecretsCacheSize, clk)
	})
	if name == "" {
		name = "default"
	}
	key := namespace + "/" + name
	if v, ok := s.lru.Get(key); ok {
		return v.([]string), nil
	}
	v, err, _ := s.reads.Do(key, func() (any, error) {
		names, err := shared.ServiceAccountPullSecrets(ctx, c, namespace, name)
		if err == nil {
			s.lru.Add(key, names, SAPullSecretsTTL)
		}
		return names, err
	})
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}
