package controllers_test

import (
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
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
