package node

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/controllers/module"
	"github.com/kmm-project/kmm/fsm"
)

// TestDrainSparesKMMAndNodeBoundPods: the pods as kmm builds them (the worker pod of each action,
// the device plugin pod) and any pod with kmm's managed-by label are spared by a drain, as are a
// static pod's mirror and a DaemonSet's pod; a workload, a ReplicaSet's pod or a pod another tool
// manages is not (issue 34: an empty podSelector evicted other Modules' worker pods).
func TestDrainSparesKMMAndNodeBoundPods(t *testing.T) {
	worker := func(a contract.Action) *corev1.Pod {
		in := intent("", false)
		in.Action = a
		if a == contract.ActionReload {
			in.Previous = &in.Entry.Config
		}
		p, err := WorkerPod("node-1", WorkerPodOptions{Image: "kmm-worker:1"}, in)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "drivers", Name: "gpu"},
		Spec: kmmv1beta1.ModuleSpec{DevicePlugin: &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "dp:1"}}}}
	dsName := module.DevicePluginName(m)
	tmpl := module.DevicePluginTemplate(m)
	devicePlugin := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	devicePlugin.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: dsName, UID: "ds", Controller: ptr.To(true)}}
	owned := func(kind string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: kind, Name: "x", UID: "x", Controller: ptr.To(true)}}}}
	}
	withLabels := func(l map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: l}}
	}

	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"a load worker pod", worker(contract.ActionLoad), fsm.SparedKMM},
		{"an unload worker pod", worker(contract.ActionUnload), fsm.SparedKMM},
		{"a reload worker pod", worker(contract.ActionReload), fsm.SparedKMM},
		{"kmm's device plugin pod", devicePlugin, fsm.SparedKMM},
		{"a kind of kmm pod added later (kmm's label only)", withLabels(map[string]string{contract.LabelManagedBy: contract.ManagedBy}), fsm.SparedKMM},
		{"a static pod's mirror", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "etcd-n1", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "h"}}}, fsm.SparedMirror},
		{"a DaemonSet's pod", owned("DaemonSet"), fsm.SparedDaemonSet},
		{"a ReplicaSet's pod", owned("ReplicaSet"), ""},
		{"a plain pod", withLabels(nil), ""},
		{"a pod another tool manages", withLabels(map[string]string{contract.LabelManagedBy: "Helm"}), ""},
		{"a pod with kmm's module labels but not its managed-by label", withLabels(map[string]string{
			contract.LabelModuleNamespace: "drivers", contract.LabelModuleName: "gpu"}), ""},
	}
	for _, c := range cases {
		if got := observeWorkload(c.pod, nil).Spared(); got != c.want {
			t.Errorf("%s: spared %q, want %q (labels %v)", c.name, got, c.want, c.pod.Labels)
		}
	}
}

// TestObserveDeviceUsers: what the reconciler reads of a pod for drain.deviceUsers and drain.jobs:
// the podSelector's miss, the resources requested or limited (the listed ones first, bounded),
// a ResourceClaim of the Module's DRA driver reserved for the pod or named by it, a Job owner.
func TestObserveDeviceUsers(t *testing.T) {
	listed := []string{"example.com/nic"}
	policy := &kmmv1beta1.DrainSpec{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
		DeviceUsers: &kmmv1beta1.DrainDeviceUsers{ExtendedResources: listed, ResourceClaims: true}}
	sel, _ := metav1.LabelSelectorAsSelector(policy.PodSelector)
	one := resource.MustParse("1")
	user := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "u", UID: "u1", Labels: map[string]string{"app": "y"}},
		Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": one}}}},
			Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"example.com/nic": one, "a.io/b": one}}}}}}
	holders := claimHolderSet{uids: map[types.UID]bool{"r1": true}, claims: map[string]bool{"ns/named": true}}
	w := observeCandidate(user, policy, sel, holders)
	if !w.OutsideSelector || strings.Join(w.Resources, ",") != "example.com/nic,a.io/b,cpu" || w.HoldsClaim || w.Job {
		t.Fatalf("device user observed as %+v", w)
	}
	if !fsm.Concerns(policy, w) {
		t.Fatal("a pod limiting the listed resource is a device user")
	}
	reserved := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "r", UID: "r1", Labels: map[string]string{"app": "x"}}}
	named := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", UID: "n1"},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "c", ResourceClaimName: ptr.To("named")}}}}
	if w := observeCandidate(reserved, policy, sel, holders); w.OutsideSelector || !w.HoldsClaim {
		t.Fatalf("a selected pod a claim is reserved for: %+v", w)
	}
	if w := observeCandidate(named, policy, sel, holders); !w.HoldsClaim {
		t.Fatalf("a pod naming an allocated claim: %+v", w)
	}
	// Many resources: the listed one is kept within the bound.
	many := corev1.ResourceList{"example.com/nic": one}
	for i := range fsm.MaxPodResources + 5 {
		many[corev1.ResourceName(fmt.Sprintf("a.io/r%02d", i))] = one
	}
	big := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: many}}}}}
	if got := podResources(big, listed); len(got) != fsm.MaxPodResources || got[0] != "example.com/nic" {
		t.Fatalf("bounded resources %d, first %q", len(got), got[0])
	}
	job := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "batch/v1", Kind: "Job", Name: "j", UID: "j", Controller: ptr.To(true)}}}}
	notJob := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "k", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "example.com/v1", Kind: "Job", Name: "k", UID: "k", Controller: ptr.To(true)}}}}
	if !observeWorkload(job, nil).Job || observeWorkload(notJob, nil).Job {
		t.Fatal("a batch Job's pod is a Job pod; another group's Job is not")
	}
}

// TestClaimHolders: the pods of the ResourceClaims allocated on the node with the Module's driver,
// only with deviceUsers.resourceClaims.
func TestClaimHolders(t *testing.T) {
	alloc := func(name, driver, node string, reservedFor ...types.UID) resourcev1.ResourceClaim {
		c := resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		c.Status.Allocation = &resourcev1.AllocationResult{
			Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{Driver: driver, Pool: "p", Device: "d", Request: "r"}}},
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
		for _, u := range reservedFor {
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: string(u), UID: u})
		}
		return c
	}
	f := &nodeFacts{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, drivers: map[string]string{"ns/gpu": "gpu.example.com"},
		claims: []resourcev1.ResourceClaim{alloc("mine", "gpu.example.com", "n1", "a"), alloc("other-driver", "x.example.com", "n1", "b"),
			alloc("other-node", "gpu.example.com", "n2", "c")}}
	policy := &kmmv1beta1.DrainSpec{DeviceUsers: &kmmv1beta1.DrainDeviceUsers{ResourceClaims: true}}
	h := claimHolders(f, "ns/gpu", policy)
	if !h.uids["a"] || h.uids["b"] || h.uids["c"] || !h.claims["ns/mine"] || len(h.claims) != 1 {
		t.Fatalf("holders %+v: want only the pod of the claim allocated on n1 with the Module's driver", h)
	}
	policy.DeviceUsers.ResourceClaims = false
	if h := claimHolders(f, "ns/gpu", policy); len(h.uids) != 0 {
		t.Fatalf("without resourceClaims no holder is read: %+v", h)
	}
}
