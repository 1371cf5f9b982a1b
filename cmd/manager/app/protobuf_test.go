package app

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/envtest"
)

// sent is one request the manager sent: its group ("" for the core group), resource, method and
// the content types it sent and accepted.
type sent struct {
	group, resource, method, contentType, accept string
	watch                                        bool
}

// wireLog records the requests of a transport.
type wireLog struct {
	next http.RoundTripper
	mu   *sync.Mutex
	reqs *[]sent
}

func (w wireLog) RoundTrip(req *http.Request) (*http.Response, error) {
	group, resource := groupResource(req.URL.Path)
	w.mu.Lock()
	*w.reqs = append(*w.reqs, sent{group: group, resource: resource, method: req.Method, watch: req.URL.Query().Get("watch") == "true",
		contentType: req.Header.Get("Content-Type"), accept: req.Header.Get("Accept")})
	w.mu.Unlock()
	return w.next.RoundTrip(req)
}

// groupResource reads the group and resource of an API path (/api/v1/..., /apis/<group>/<version>/...).
func groupResource(path string) (string, string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	group, rest := "", []string(nil)
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, rest = parts[1], parts[3:]
	default:
		return "", ""
	}
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) > 2 {
		rest = rest[2:]
	}
	if len(rest) == 0 {
		return group, ""
	}
	return group, rest[0]
}

// builtIn says whether a group is one of Kubernetes' own (protobuf-capable) groups.
func builtIn(group string) bool {
	return group == "" || group == "apps" || strings.HasSuffix(group, ".k8s.io")
}

// TestBuiltInKindsGoAsProtobuf checks that every request the manager's parts send about a built-in
// kind (the cache's lists and watches of Pods and Nodes, the client's writes, the Events, the
// leader election Lease) sends and accepts protobuf, while kmm's own kinds, which have no protobuf
// encoding, still go as JSON and succeed (issue 41).
func TestBuiltInKindsGoAsProtobuf(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env, err := envtest.StartWith(envtest.Options{NoWebhook: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := client.New(env.Config, client.Options{Scheme: NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	const ns = "kmm-proto"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	var reqs []sent
	mu := &sync.Mutex{}
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return wireLog{next: rt, mu: mu, reqs: &reqs} })
	o := bareOptions()
	o.LeaderElect, o.LeaderElectNamespace = true, ns
	mgr, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-mgr.Elected():
	case <-ctx.Done():
		t.Fatal("not elected")
	}
	exerciseManager(ctx, t, mgr.GetClient(), mgr.GetAPIReader(), func(nmc *kmmv1beta1.NodeModulesConfig) {
		mgr.GetEventRecorder("kmm-test").Eventf(nmc, nil, corev1.EventTypeNormal, "Tested", "Test", "protobuf")
	})
	// Events go out asynchronously: wait until the API server has this one and the Lease lock's
	// ("became leader").
	for {
		var evs metav1.PartialObjectMetadataList
		evs.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("EventList"))
		if err := admin.List(ctx, &evs); err == nil && len(evs.Items) >= 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the Event never reached the API server")
		case <-time.After(100 * time.Millisecond):
		}
	}
	mu.Lock()
	defer mu.Unlock()
	checkContentTypes(t, reqs)
}

// exerciseManager makes the manager's client, cache and API reader read and write built-in and
// kmm kinds, and records an Event with record.
func exerciseManager(ctx context.Context, t *testing.T, c client.Client, api client.Reader, record func(*kmmv1beta1.NodeModulesConfig)) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "proto-node"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kmm-proto", Name: "p"},
		Spec: corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}
	steps := []func() error{
		func() error { return c.Create(ctx, node) },
		func() error { return c.Create(ctx, pod) },
		func() error { return c.List(ctx, &corev1.PodList{}) }, // starts the cache's Pod informer
		func() error { return c.Get(ctx, client.ObjectKeyFromObject(node), &corev1.Node{}) },
		func() error {
			return c.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`)))
		},
		func() error { return c.Create(ctx, nmc) },
		func() error { return c.Status().Update(ctx, nmc) },
		func() error { return api.Get(ctx, client.ObjectKeyFromObject(nmc), &kmmv1beta1.NodeModulesConfig{}) },
		func() error { return api.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}) },
		func() error { return c.Delete(ctx, pod) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	record(nmc)
}

// checkContentTypes asserts that built-in kinds went as protobuf and kmm's as JSON, and that each
// part of the manager was seen.
func checkContentTypes(t *testing.T, reqs []sent) {
	t.Helper()
	seen := map[string]bool{}
	for _, r := range reqs {
		if r.resource == "" {
			continue // discovery
		}
		key := fmt.Sprintf("%s %s %s", r.method, r.group, r.resource)
		if r.watch {
			key = "WATCH " + r.group + " " + r.resource
		}
		seen[key] = true
		body := r.method == http.MethodPost || r.method == http.MethodPut
		if builtIn(r.group) {
			if !strings.HasPrefix(r.accept, "application/vnd.kubernetes.protobuf") {
				t.Errorf("%s accepts %q, not protobuf first", key, r.accept)
			}
			if body && r.contentType != "application/vnd.kubernetes.protobuf" {
				t.Errorf("%s sends %q, not protobuf", key, r.contentType)
			}
		} else if body && r.contentType != "application/json" {
			t.Errorf("%s (a kmm kind) sends %q, not JSON", key, r.contentType)
		}
	}
	for _, want := range []string{"GET  pods", "WATCH  pods", "POST  pods", "PATCH  nodes", "PUT kmm.sigs.x-k8s.io nodemodulesconfigs",
		"POST events.k8s.io events", "POST coordination.k8s.io leases", "PUT coordination.k8s.io leases", "GET kmm.sigs.x-k8s.io nodemodulesconfigs"} {
		if !seen[want] {
			t.Errorf("no %q request seen; seen: %v", want, seen)
		}
	}
}
