package controllers_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestWorkerPodGetsTheServiceAccountsPullSecrets: the worker pod of a Module whose service account
// has imagePullSecrets projects them (optionally) into the pod and tells the worker where.
func TestWorkerPodGetsTheServiceAccountsPullSecrets(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	var mu sync.Mutex
	var seen *corev1.Pod
	testbed.Watch(t, cluster, &corev1.PodList{}, func(_ watch.EventType, p *corev1.Pod) {
		mu.Lock()
		defer mu.Unlock()
		if seen == nil {
			seen = p.DeepCopy()
		}
	}, client.InNamespace(tb.NS), client.MatchingLabels{contract.LabelWorker: "true"})
	tb.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "loader"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "team-registry"}, {Name: "mirror-registry"}}})
	m := tb.Module("nic")
	m.Spec.ModuleLoader.ServiceAccountName = "loader"
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)

	mu.Lock()
	defer mu.Unlock()
	if seen == nil {
		t.Fatal("no worker pod seen")
	}
	var secrets []string
	for _, v := range seen.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.Secret != nil && s.Secret.Optional != nil && *s.Secret.Optional {
				secrets = append(secrets, s.Secret.Name)
			}
		}
	}
	if len(secrets) != 2 || secrets[0] != "team-registry" || secrets[1] != "mirror-registry" {
		t.Errorf("projected optional secrets %v, want the service account's two, in order", secrets)
	}
	if !hasArgs(seen.Spec.Containers[0].Args, "--pull-secret-dir", "/var/run/kmm/sa-pull-secrets") {
		t.Errorf("args %q lack --pull-secret-dir", seen.Spec.Containers[0].Args)
	}
}

func hasArgs(args []string, flag, value string) bool {
	for i := range len(args) - 1 {
		if args[i] == flag && args[i+1] == value {
			return true
		}
	}
	return false
}

// TestWorkerPodsShareOneServiceAccountRead: the worker pods of a load read their service account
// once, not once per pod (issue 22: a GET per pair before), and still project its pull secrets.
func TestWorkerPodsShareOneServiceAccountRead(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 8, testbed.KernelA)
	tb.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "loader"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "team-registry"}}})
	var mu sync.Mutex
	projected := 0
	testbed.Watch(t, cluster, &corev1.PodList{}, func(ev watch.EventType, p *corev1.Pod) {
		mu.Lock()
		defer mu.Unlock()
		if ev == watch.Added && hasArgs(p.Spec.Containers[0].Args, "--pull-secret-dir", "/var/run/kmm/sa-pull-secrets") {
			projected++
		}
	}, client.InNamespace(tb.NS), client.MatchingLabels{contract.LabelWorker: "true"})
	before := serviceAccountGets(t)
	m := tb.Module("nic")
	m.Spec.ModuleLoader.ServiceAccountName = "loader"
	tb.Create(m)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	gets := serviceAccountGets(t) - before
	mu.Lock()
	defer mu.Unlock()
	if projected != len(tb.Nodes) {
		t.Errorf("%d worker pods projected the service account's pull secrets, want %d", projected, len(tb.Nodes))
	}
	// One read by the operator; one more allowed for another client of the test cluster.
	if gets > 2 {
		t.Errorf("%d GETs of service accounts for %d worker pods, want at most 2", gets, len(tb.Nodes))
	}
}

// serviceAccountGets is the API server's count of GET requests for service accounts.
func serviceAccountGets(t *testing.T) int {
	t.Helper()
	hc, err := rest.HTTPClientFor(cluster.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(strings.TrimSuffix(cluster.Env.Config.Host, "/") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="serviceaccounts"`) ||
			!strings.Contains(line, `verb="GET"`) || !strings.Contains(line, `subresource=""`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		n += int(v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestUnreadableServiceAccountIsReported: the operator may not read the Module's service account
// (its GETs of it reach the real API server as a user without RBAC rules, which answers 403
// Forbidden). No worker pod is made without the service account's pull secrets: the pair backs off
// with reason ServiceAccountUnreadable and a message quoting the API server, one Warning Event
// series says so on the Module (not one Event per reconcile), and once the read is allowed the
// worker pod projects the secrets and the module loads (issue 34: the secrets were dropped
// silently and the worker ran without them).
func TestUnreadableServiceAccountIsReported(t *testing.T) {
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	forbid := startOperatorForbiddenToGet(t, "/api/v1/namespaces/"+tb.NS+"/serviceaccounts/loader")
	tb.Create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "loader"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "team-registry"}}})
	m := tb.Module("nic")
	m.Spec.ModuleLoader.ServiceAccountName = "loader"
	tb.Create(m)

	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		st := cluster.PairStatus(n, tb.NS, "nic")
		return st != nil && st.State == kmmv1beta1.StateLoadBackOff && st.Reason == fsm.ReasonServiceAccountUnreadable &&
			strings.Contains(st.Message, "forbidden") && strings.Contains(st.Message, tb.NS+"/loader") && st.Attempts >= 2, testbed.Describe(st)
	})
	t.Logf("while forbidden: %s", testbed.Describe(cluster.PairStatus(n, tb.NS, "nic")))
	if runs := node.RunCount(n, tb.NS+"/nic"); runs != 0 || len(workerPodsOn(t, n)) != 0 {
		t.Fatalf("%d worker runs, %d worker pods without the service account's pull secrets, want none", runs, len(workerPodsOn(t, n)))
	}
	// One Warning Event on the Module per failed attempt (each a WorkerRejected transition), none
	// for the reconciles in between: the Events, counted first, are at least one and at most the
	// attempts counted after them.
	var events int
	testbed.Eventually(t, 10*time.Second, func() (bool, string) {
		events = warningEvents(t, tb.NS, "nic", fsm.ReasonServiceAccountUnreadable)
		return events >= 1, "a Warning Event ServiceAccountUnreadable on the Module"
	})
	if attempts := cluster.PairStatus(n, tb.NS, "nic").Attempts; events > int(attempts) {
		t.Errorf("%d Warning Events ServiceAccountUnreadable on the Module for %d failed attempts: more than one per attempt", events, attempts)
	}

	forbid.Store(false)
	tb.WaitLoaded("nic", "reg.example.com/nic:a", n)
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.InNamespace(tb.NS), client.MatchingLabels{contract.LabelWorker: "true"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !hasArgs(p.Spec.Containers[0].Args, "--pull-secret-dir", "/var/run/kmm/sa-pull-secrets") {
			t.Errorf("worker pod %s lacks the service account's pull secrets: %q", p.Name, p.Spec.Containers[0].Args)
		}
	}
}

// startOperatorForbiddenToGet starts the operator with its GETs of path sent to the real API server
// as a user without RBAC rules (403 Forbidden) while the returned flag is set (it starts set).
func startOperatorForbiddenToGet(t *testing.T, path string) *atomic.Bool {
	t.Helper()
	var forbid atomic.Bool
	forbid.Store(true)
	cluster.StartOperatorAs(t, func(cfg *rest.Config) {
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if forbid.Load() && req.Method == http.MethodGet && req.URL.Path == path {
					req = req.Clone(req.Context())
					req.Header.Set(transport.ImpersonateUserHeader, "kmm-test-without-rbac")
				}
				return rt.RoundTrip(req)
			})
		})
	})
	return &forbid
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
