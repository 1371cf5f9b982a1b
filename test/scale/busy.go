package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Busy makes the cluster not empty (issue 41, item 3): nodes that look real (full status, a list of
// images) and whose simulated kubelet renews their Lease and posts their status as a real one does,
// unrelated pods on every node (running, in other namespaces) replaced at a steady rate, and
// ConfigMaps and Secrets in those namespaces. The phases idle (after the load, no Module change)
// and newmodule (one more Module) measure the steady state and a change in it.
type Busy struct {
	// PodsPerNode unrelated pods run on every node (30 by default).
	PodsPerNode int
	// Churn is how many of them are replaced (deleted, then a new one created and started) per
	// second across the cluster; 0 means Nodes/100 (each pod lives 50 min on average at 30 a node).
	Churn float64
	// Namespaces hold the pods, ConfigMaps and Secrets (10 by default).
	Namespaces int
	// LeasePeriod and StatusPeriod are the simulated kubelet's (agent.Options); 0 means 10 s and
	// 60 s (a real kubelet posts an unchanged status every 5 min: 60 s asks more of kmm).
	LeasePeriod, StatusPeriod time.Duration
	// Idle is how long the idle phase watches the operator (60 s by default).
	Idle time.Duration
}

// withDefaults fills in Busy's zero values for a cluster of nodes.
func (b Busy) withDefaults(nodes int) Busy {
	if b.PodsPerNode == 0 {
		b.PodsPerNode = 30
	}
	if b.Churn == 0 {
		b.Churn = float64(nodes) / 100
	}
	if b.Namespaces == 0 {
		b.Namespaces = 10
	}
	if b.LeasePeriod == 0 {
		b.LeasePeriod = 10 * time.Second
	}
	if b.StatusPeriod == 0 {
		b.StatusPeriod = 60 * time.Second
	}
	if b.Idle == 0 {
		b.Idle = 60 * time.Second
	}
	return b
}

// busyWriters is how many requests the harness has in flight while it fills the cluster.
const busyWriters = 32

// realNodeLabels are the labels of a cloud node beside the harness's own.
func realNodeLabels(i int) map[string]string {
	zone := fmt.Sprintf("region-1%c", 'a'+rune(i%3))
	return map[string]string{"kmm-scale": "true", corev1.LabelArchStable: "amd64", corev1.LabelInstanceTypeStable: "m6i.4xlarge",
		corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: zone, "node.kubernetes.io/pool": fmt.Sprintf("pool-%d", i%4),
		"node-role.kubernetes.io/worker": ""}
}

// busyNamespace is the i-th namespace of the unrelated objects.
func busyNamespace(i int) string { return fmt.Sprintf("busy-%02d", i) }

// populate creates the namespaces with their ConfigMaps and Secrets, then PodsPerNode running pods
// on every node.
func (h *harness) populate(ctx context.Context) error {
	b := *h.o.Busy
	var objs []client.Object
	for i := range b.Namespaces {
		ns := busyNamespace(i)
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": fmt.Sprintf("team-%d", i)}}})
		for j := range 5 {
			objs = append(objs, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("config-%d", j)},
				Data: map[string]string{"app.yaml": fmt.Sprintf("replicas: 3\nlogLevel: info\nfeature-%d: true\n", j)}})
		}
		for j := range 2 {
			objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("credentials-%d", j)},
				Data: map[string][]byte{"token": []byte(fmt.Sprintf("not-a-secret-%d-%d", i, j))}})
		}
	}
	for _, o := range objs {
		if err := h.k8s.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	h.sayf("starting %d unrelated pods (%d a node)", len(h.nodes)*b.PodsPerNode, b.PodsPerNode)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, busyWriters)
	total := len(h.nodes) * b.PodsPerNode
	for range busyWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				if err := h.startBusyPod(ctx, i/b.PodsPerNode, i%b.PodsPerNode, 0); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// busyPodName names generation gen of the k-th unrelated pod of node n.
func (h *harness) busyPod(n, k, gen int) *corev1.Pod {
	app := fmt.Sprintf("service-%d", k)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: busyNamespace(k % h.o.Busy.Namespaces), Name: fmt.Sprintf("%s-%s-%d", app, h.nodes[n], gen),
			Labels:      map[string]string{"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "shop", "pod-template-hash": "5d8f7c9b6"},
			Annotations: map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: app + "-5d8f7c9b6",
				UID: types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", k)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName: h.nodes[n], AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers: []corev1.Container{{
				Name: "app", Image: fmt.Sprintf("registry.example.com/team-%d/%s:v1.%d.0", k%7, app, k%13),
				Args:  []string{"--config=/etc/app/app.yaml", "--listen=:8080"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}},
				Env:   []corev1.EnvVar{{Name: "GOMAXPROCS", Value: "2"}, {Name: "APP_ENV", Value: "production"}, {Name: "POD_NAME", Value: app}},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
			}},
		},
	}
}

// startBusyPod creates generation gen of the k-th unrelated pod of node n and writes it Running and
// Ready, as the kubelet would.
func (h *harness) startBusyPod(ctx context.Context, n, k, gen int) error {
	pod := h.busyPod(n, k, gen)
	if err := h.k8s.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating unrelated pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	now := metav1.NewTime(time.Now()).Rfc3339Copy()
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: internalIP(n), PodIP: fmt.Sprintf("10.%d.%d.%d", 128+n%64, n/64%256, k+2),
		StartTime: &now, QOSClass: corev1.PodQOSBurstable,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Started: ptr.To(true), Image: pod.Spec.Containers[0].Image,
			ImageID:     "registry.example.com/digest@sha256:" + fmt.Sprintf("%064x", k),
			ContainerID: fmt.Sprintf("containerd://%064x", n*1000+k*10+gen),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	if err := h.k8s.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("starting unrelated pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// internalIP is node n's made-up address.
func internalIP(n int) string { return fmt.Sprintf("10.0.%d.%d", n/250, n%250+1) }

// churn replaces unrelated pods at Busy.Churn per second until ctx ends: a pod at random goes
// (deleted at once, as a kubelet confirms a deletion) and its next generation starts. It counts
// the pods replaced.
func (h *harness) churn(ctx context.Context, replaced *atomic.Int64) {
	b := *h.o.Busy
	rnd := rand.New(rand.NewPCG(1, 2)) //nolint:gosec // G404: a reproducible choice of pods to replace, not a secret

	gens := make([]int, len(h.nodes)*b.PodsPerNode)
	start := time.Now()
	for done := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		want := int(time.Since(start).Seconds() * b.Churn)
		for ; done < want && ctx.Err() == nil; done++ {
			i := rnd.IntN(len(gens))
			n, k := i/b.PodsPerNode, i%b.PodsPerNode
			old := h.busyPod(n, k, gens[i])
			if err := h.k8s.Delete(ctx, old, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				continue
			}
			gens[i]++
			if err := h.startBusyPod(ctx, n, k, gens[i]); err == nil {
				replaced.Add(1)
			}
		}
	}
}

// idle is the idle phase: once the operator's writes have settled after the load, it watches the
// operator for Busy.Idle (60 s without Busy) with no Module change and measures what the operator
// spent and wrote meanwhile.
func (h *harness) idle(ctx context.Context, op *operator) (Phase, error) {
	p := Phase{Name: "idle"}
	// Writes, not reconciles: an operator that reconciles on every Node status post never stops.
	if _, err := h.settleOn(ctx, op, noWrites); err != nil {
		return p, fmt.Errorf("phase idle: %w", err)
	}
	before, err := h.snapshot(ctx, op)
	if err != nil {
		return p, err
	}
	replaced := h.replaced.Load()
	window := time.Minute
	if h.o.Busy != nil {
		window = h.o.Busy.Idle
	}
	h.sayf("phase idle: watching the operator for %v", window)
	if h.profiles("idle") {
		h.profile(ctx, op)
	}
	select {
	case <-ctx.Done():
		return p, ctx.Err()
	case <-time.After(window):
	}
	after, err := h.snapshot(ctx, op)
	if err != nil {
		return p, err
	}
	p.Seconds = after.at.Sub(before.at).Seconds()
	p.SettledSeconds = p.Seconds
	p.ChurnedPods = int(h.replaced.Load() - replaced)
	return p, h.fill(&p, before, after, op)
}

// steadyState runs, as asked, the idle phase (no Module change) and the newmodule phase: one
// more Module, selecting every node, until all its pairs are Loaded.
func (h *harness) steadyState(ctx context.Context, res *Result, op *operator) error {
	if h.runs("idle") {
		p, err := h.idle(ctx, op)
		res.Phases = append(res.Phases, p)
		if err != nil {
			return err
		}
	}
	if !h.runs("newmodule") {
		return nil
	}
	p, err := h.measure(ctx, "newmodule", &op, func(ctx context.Context) error {
		if err := h.k8s.Create(ctx, h.module(h.o.Modules)); err != nil {
			return err
		}
		return h.waitLoadedN(ctx, "", h.o.Nodes*(h.o.Modules+1))
	})
	res.Phases = append(res.Phases, p)
	return err
}
