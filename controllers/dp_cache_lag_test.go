package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/cmd/manager/app"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/test/testbed"
)

// blindToDevicePlugins is the manager's client with a cache that never shows a device plugin
// pod: the extreme of a pod informer lagging behind the DaemonSet controller, which creates a
// device plugin pod the moment the ready label lands on a node.
type blindToDevicePlugins struct{ client.Client }

func (c blindToDevicePlugins) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if pods, ok := list.(*corev1.PodList); ok {
		kept := pods.Items[:0]
		for _, p := range pods.Items {
			if p.Labels[contract.LabelDevicePlugin] == "" {
				kept = append(kept, p)
			}
		}
		pods.Items = kept
	}
	return nil
}

// wrapOperatorClient sets the operator's options so that its manager's client is wrap of the one
// it would have.
func wrapOperatorClient(wrap func(client.Client) client.Client) func(*app.Options) {
	return func(o *app.Options) {
		o.Instrument = func(mo *ctrl.Options) {
			newClient := mo.NewClient
			if newClient == nil {
				newClient = client.New
			}
			mo.NewClient = func(cfg *rest.Config, co client.Options) (client.Client, error) {
				c, err := newClient(cfg, co)
				return wrap(c), err
			}
		}
	}
}

// TestUnloadWaitsForADevicePluginPodTheCacheHasNotSeen: whether the module's device plugin pod is
// on the node is read from the API server before an unload, not from the cache. With a cache that
// never shows device plugin pods, deleting the Module still drains the device plugin first: no
// unload pod while a device plugin pod of the Module is on the node (invariant 6). Before the fix
// the unload pod came at once, beside the Ready device plugin pod (the failure
// TestTakeoverHandsOverDevicePlugin met once under load, when kube-controller-manager created a
// device plugin pod just before the Module's deletion and kmm's pod informer had not delivered it).
func TestUnloadWaitsForADevicePluginPodTheCacheHasNotSeen(t *testing.T) {
	ctx := context.Background()
	tb := cluster.NewBed(t, 1, testbed.KernelA)
	n := tb.Nodes[0]
	m := tb.Module("nic")
	m.Spec.DevicePlugin = &kmmv1beta1.DevicePluginSpec{Container: kmmv1beta1.DevicePluginContainerSpec{Image: "reg.example.com/nic-dp:1"}}
	cov := watchDevicePluginCoverage(t, tb, "nic")
	cluster.StartOperatorWith(t, wrapOperatorClient(func(c client.Client) client.Client { return blindToDevicePlugins{Client: c} }))
	tb.Create(m)
	tb.WaitLoaded("nic", m.Spec.ModuleLoader.Container.KernelMappings[0].ContainerImage, n)
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		by := cov.servedBy()
		return len(by[n]) > 0, fmt.Sprintf("a Ready device plugin pod on %s: %v", n, by)
	})

	if err := k8s.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 60*time.Second, func() (bool, string) {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), &kmmv1beta1.Module{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("the Module is still there (%v)", err)
		}
		if _, ok := node.Loaded(n)[tb.NS+"/nic"]; ok {
			return false, "nic still loaded on " + n
		}
		return true, ""
	})
	if v := cov.invariant6(); len(v) > 0 {
		t.Fatalf("invariant 6 broken: %v", v)
	}
}
