package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/testbed"
)

// TestNamespaceHoldingModulesCannotBeDeleted: the namespace of a Module is labelled as holding
// Modules, the webhook refuses its deletion naming the Module to delete first, and once the Module
// is gone the label goes and the namespace can be deleted. It fails when the guard lets the deletion
// through, and when the label is not set or not removed.
func TestNamespaceHoldingModulesCannotBeDeleted(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	tb.Create(tb.Module("nic"))
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	waitNamespaceLabel(t, tb.NS, true)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tb.NS}}
	err := k8s.Delete(context.Background(), ns)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "delete Module nic first") {
		t.Fatalf("deleting the namespace of a Module: %v; want it refused, naming Module nic", err)
	}
	if got := getNamespace(t, tb.NS); got.DeletionTimestamp != nil {
		t.Fatal("the namespace is being deleted after the refusal")
	}

	if err := k8s.Delete(context.Background(), &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "nic"}}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		err := k8s.Get(context.Background(), client.ObjectKey{Namespace: tb.NS, Name: "nic"}, &kmmv1beta1.Module{})
		return apierrors.IsNotFound(err), "the Module unloaded and gone"
	})
	waitNamespaceLabel(t, tb.NS, false)
	if err := k8s.Delete(context.Background(), ns); err != nil {
		t.Fatalf("deleting the namespace once its Modules are gone: %v", err)
	}
}

// TestNamespaceDeletedAroundTheGuard: with the guard bypassed (its webhook removed, as when the
// webhook is down or off), the namespace of a loaded Module is deleted and the Module with it. The
// Module turns Degraded with reason NamespaceTerminating naming the nodes that still have the
// module, with one Event (on the Namespace, related to the Module) over several retries; the module
// stays loaded. The documented way out then works: remove the Module's finalizer, let the
// namespace go, create it again, and the pending unloads run. It fails when the condition or the
// Event is missing (the Module only says WorkerFailing, PodRejected), or the Event repeats.
func TestNamespaceDeletedAroundTheGuard(t *testing.T) {
	cluster.StartOperator(t)
	tb := cluster.NewBed(t, 2, testbed.KernelA)
	tb.Create(tb.Module("nic"))
	tb.WaitLoaded("nic", "reg.example.com/nic:a", tb.Nodes...)
	waitNamespaceLabel(t, tb.NS, true)

	bypassNamespaceGuard(t)
	ctx := context.Background()
	if err := k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tb.NS}}); err != nil {
		t.Fatal(err)
	}
	// What the namespace controller does first (the test bed does not run it): delete the content.
	if err := k8s.Delete(ctx, &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "nic"}}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		m := &kmmv1beta1.Module{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: tb.NS, Name: "nic"}, m); err != nil {
			return false, err.Error()
		}
		d := meta.FindStatusCondition(m.Status.Conditions, kmmv1beta1.ConditionDegraded)
		if d == nil || d.Reason != kmmv1beta1.ReasonNamespaceTerminating || !strings.Contains(d.Message, strings.Join(tb.Nodes, ", ")) {
			return false, fmt.Sprintf("Degraded %+v, want NamespaceTerminating naming %v", d, tb.Nodes)
		}
		for _, n := range tb.Nodes {
			if st := cluster.PairStatus(n, tb.NS, "nic"); st == nil || st.State != "UnloadBackOff" || st.Attempts < 3 {
				return false, fmt.Sprintf("%s: %s, want UnloadBackOff after 3 attempts", n, testbed.Describe(st))
			}
		}
		return true, ""
	})
	if got := namespaceEvents(t, tb.NS); len(got) != 1 || !strings.Contains(got[0].Note, "is being deleted") ||
		got[0].Related == nil || got[0].Related.Name != "nic" {
		t.Fatalf("Events %s regarding namespace %s, want one, related to Module nic", describeEvents(got), tb.NS)
	}
	for _, n := range tb.Nodes {
		if _, loaded := node.Loaded(n)[tb.NS+"/nic"]; !loaded {
			t.Fatalf("the module is no longer loaded on %s", n)
		}
	}

	// The way out (docs/troubleshooting.md): let the Module go, let the namespace go, create it again.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	if err := k8s.Patch(ctx, &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: tb.NS, Name: "nic"}}, patch); err != nil {
		t.Fatal(err)
	}
	finishNamespaceDeletion(t, tb.NS)
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tb.NS}}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, n := range tb.Nodes {
			if _, loaded := node.Loaded(n)[tb.NS+"/nic"]; loaded || cluster.PairStatus(n, tb.NS, "nic") != nil {
				return false, fmt.Sprintf("%s: %s, want the module unloaded and its record gone", n, testbed.Describe(cluster.PairStatus(n, tb.NS, "nic")))
			}
		}
		return true, ""
	})
}

func getNamespace(t *testing.T, name string) *corev1.Namespace {
	t.Helper()
	ns := &corev1.Namespace{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

func waitNamespaceLabel(t *testing.T, name string, want bool) {
	t.Helper()
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		_, has := getNamespace(t, name).Labels[kmmv1beta1.NamespaceLabel]
		return has == want, fmt.Sprintf("namespace %s labelled %s: %v", name, kmmv1beta1.NamespaceLabel, want)
	})
}

// bypassNamespaceGuard removes the namespace guard's webhook from the cluster's webhook
// configuration for the rest of the test.
func bypassNamespaceGuard(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	list := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	if err := k8s.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		cfg := &list.Items[i]
		at := slices.IndexFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
			return w.Name == "vnamespace.kmm.sigs.x-k8s.io"
		})
		if at < 0 {
			continue
		}
		guard := cfg.Webhooks[at]
		cfg.Webhooks = slices.Delete(cfg.Webhooks, at, at+1)
		if err := k8s.Update(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := k8s.Get(ctx, client.ObjectKeyFromObject(cfg), cfg); err != nil {
					return err
				}
				cfg.Webhooks = append(cfg.Webhooks, guard)
				return k8s.Update(ctx, cfg)
			})
			if err != nil {
				t.Errorf("restoring the namespace guard: %v", err)
			}
		})
		return
	}
	t.Fatal("no webhook configuration holds the namespace guard")
}

// namespaceEvents are the Events regarding namespace name (a cluster-scoped object: in default).
func namespaceEvents(t *testing.T, name string) []eventsv1.Event {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "Namespace" && e.Regarding.Name == name && e.Reason == kmmv1beta1.ReasonNamespaceTerminating {
			out = append(out, e)
		}
	}
	return out
}

func describeEvents(events []eventsv1.Event) string {
	var out []string
	for _, e := range events {
		out = append(out, fmt.Sprintf("%s %s: %s (count %d)", e.Type, e.Reason, e.Note, e.DeprecatedCount))
	}
	return fmt.Sprintf("%q", out)
}

// finishNamespaceDeletion does the rest of the namespace controller's work for namespace name:
// it deletes the Events left in it and removes its finalizer, so that the API server removes it.
func finishNamespaceDeletion(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.DeleteAllOf(ctx, &eventsv1.Event{}, client.InNamespace(name)); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cluster.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := getNamespace(t, name)
	ns.Spec.Finalizers = nil
	if _, err := cs.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 20*time.Second, func() (bool, string) {
		err := k8s.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), "namespace " + name + " gone"
	})
}
