package controllers_test

import (
	"bufio"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/contract"
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
