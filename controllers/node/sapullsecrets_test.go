package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/controllers/shared"
)

// saReader serves one service account, counts its reads and fails them while err is set. It stands
// in for the API server only to count the cache's reads (the envtest
// TestWorkerPodsShareOneServiceAccountRead counts them at the API server).
type saReader struct {
	client.Reader
	secrets []string
	err     error
	reads   int
}

func (r *saReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.reads++
	if r.err != nil {
		return r.err
	}
	sa := obj.(*corev1.ServiceAccount)
	sa.ImagePullSecrets = nil
	for _, s := range r.secrets {
		sa.ImagePullSecrets = append(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	return nil
}

// TestSAPullSecretsCacheTTL: a service account is read once per SAPullSecretsTTL; a change reaches
// the pods created after the TTL; a failed read is not remembered.
func TestSAPullSecretsCacheTTL(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC))
	r := &saReader{secrets: []string{"a"}}
	var c saPullSecretsCache
	get := func() []string {
		t.Helper()
		got, err := c.get(ctx, r, clk, "ns", "")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for range 5 {
		get()
	}
	if r.reads != 1 {
		t.Fatalf("%d reads for 5 pods within the TTL, want 1", r.reads)
	}
	r.secrets = []string{"a", "b"}
	clk.Step(SAPullSecretsTTL - time.Second)
	if got := get(); len(got) != 1 {
		t.Errorf("within the TTL: %v, want the remembered [a]", got)
	}
	clk.Step(2 * time.Second)
	if got := get(); len(got) != 2 || r.reads != 2 {
		t.Errorf("after the TTL: %v after %d reads, want [a b] after 2", got, r.reads)
	}
	r.err = errors.New("connection refused")
	if _, err := c.get(ctx, r, clk, "ns", "other"); err == nil {
		t.Fatal("a failed read was not reported")
	}
	r.err = nil
	if got, err := c.get(ctx, r, clk, "ns", "other"); err != nil || len(got) != 2 || r.reads != 4 {
		t.Errorf("after a failed read: %v, %v after %d reads, want [a b] read again (4 reads)", got, err, r.reads)
	}
}

// TestServiceAccountReadFailures: a service account that does not exist has no pull secrets (the
// API server then refuses the pod, naming it); Forbidden and any other failure are returned, with
// the service account named, not taken for "no secrets" (issue 34).
func TestServiceAccountReadFailures(t *testing.T) {
	gr := schema.GroupResource{Resource: "serviceaccounts"}
	if got, err := shared.ServiceAccountPullSecrets(context.Background(), &saReader{err: apierrors.NewNotFound(gr, "loader")}, "ns", "loader"); err != nil || got != nil {
		t.Errorf("not found: %v, %v; want no secrets and no error", got, err)
	}
	for _, readErr := range []error{apierrors.NewForbidden(gr, "loader", errors.New("RBAC: access denied")), apierrors.NewInternalError(errors.New("etcd"))} {
		_, err := shared.ServiceAccountPullSecrets(context.Background(), &saReader{err: readErr}, "ns", "loader")
		if err == nil || !errors.Is(err, readErr) || !strings.Contains(err.Error(), "ns/loader") {
			t.Errorf("%v: got %v, want it returned naming ns/loader", readErr, err)
		}
	}
}
