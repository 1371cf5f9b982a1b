//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"helm.sh/helm/v4/pkg/kube"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/install"
	"github.com/kmm-project/kmm/test/poll"
)

// testChart is make e2e's second install path: kmm from config/ removed as `make undeploy` does,
// then installed with the Helm chart (the Helm Go SDK, as `helm install` runs it) with the same
// settings as test/e2e/overlay, on the real node: the webhook answers, a Module loads, is
// deleted and unloads, and `helm uninstall` removes the operator.
func testChart(t *testing.T, k *kmmEnv) {
	ctx := context.Background()
	start := time.Now()
	kustomize, err := install.Kustomize(shared.root)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := install.Render(ctx, kustomize, filepath.Join(shared.root, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	if err := install.Delete(ctx, k.cl, objs, false, nil); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, waitStep, 500*time.Millisecond, func() (bool, string) {
		for _, u := range objs {
			if u.GetKind() != "CustomResourceDefinition" && u.GetKind() != "Namespace" {
				continue
			}
			var obj client.Object = &apiextensionsv1.CustomResourceDefinition{}
			if u.GetKind() == "Namespace" {
				obj = &corev1.Namespace{}
			}
			if err := k.cl.Get(ctx, client.ObjectKey{Name: u.GetName()}, obj); !apierrors.IsNotFound(err) {
				return false, fmt.Sprintf("%s %s to be gone after the uninstall (%v)", u.GetKind(), u.GetName(), err)
			}
		}
		return true, ""
	})
	tm.add("chart: the config/ install removed (CRDs and namespace gone)", start)

	start = time.Now()
	log, err := os.Create(filepath.Join(k.c.LogDir(), "helm.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	h, err := install.NewHelm(k.c.KubeconfigPath(), operatorNamespace, log)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := install.LoadChart(filepath.Join(shared.root, install.ChartDir))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Install(ctx, ch, "kmm", k.chartValues(), kube.HookOnlyStrategy, waitStep); err != nil {
		t.Fatalf("helm install: %v", err)
	}
	k.waitWebhook(t)
	tm.add("chart: helm install → operator Ready, webhook answering", start)

	start = time.Now()
	m := k.module(modRestart, "", k.kmodImages[modRestart].ref, false)
	m.Name = "chart"
	m.Spec.ModuleLoader.Container.Modprobe.ModuleName = kernelModules[modRestart]
	if err := k.cl.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	k.waitLoaded(t, m.Name, "")
	if _, ok := k.nodeLabels(t)[kmmv1beta1.ReadyLabel(kmmNamespace, m.Name)]; !ok {
		t.Error("the Module is Loaded but the node has no ready label")
	}
	if err := k.cl.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		return apierrors.IsNotFound(k.cl.Get(ctx, client.ObjectKeyFromObject(m), &kmmv1beta1.Module{})), "the Module to be gone (unloaded)"
	})
	tm.add("chart: a Module loads on the node, is deleted and unloads", start)

	start = time.Now()
	if err := h.Uninstall("kmm", waitStep); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	poll.Until(t, waitStep, 250*time.Millisecond, func() (bool, string) {
		pods, err := k.cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, fmt.Sprintf("the operator's pods to be gone (%v)", err)
	})
	tm.add("chart: helm uninstall", start)
}

// chartValues are test/e2e/overlay's changes to config/default as the chart's values (the
// reasons are in the overlay's files): the host network, the API server at 127.0.0.1, listening
// on the node IP, the dry-run sandbox and containerd's config_path, and the images of this run.
func (k *kmmEnv) chartValues() map[string]any {
	env := []any{
		map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
		map[string]any{"name": "POD_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.podIP"}}},
	}
	for _, e := range k.c.HostNetworkEnv() {
		if e.Name == "KUBERNETES_SERVICE_PORT" {
			env = append(env, map[string]any{"name": e.Name, "value": e.Value})
		}
	}
	return map[string]any{"controller": map[string]any{
		"image":       k.managerRef,
		"workerImage": k.workerRef,
		"hostNetwork": true,
		"extraEnv":    env,
		"extraArgs": []any{
			"--webhook-host=$(POD_IP)",
			"--health-probe-bind-address=$(POD_IP):8081",
			"--metrics-bind-address=$(POD_IP):8443",
		},
		"worker": map[string]any{
			"dryRunSandbox":        k.sandbox,
			"containerdConfigPath": k.c.ContainerdConfigPath(),
		},
	}}
}
