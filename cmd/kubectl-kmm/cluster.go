package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// pluginScheme knows the kinds the plugin reads: kmm's own, and core's. The plugin has its own scheme so that
// it does not link the operator (internal/manager and every controller).
func pluginScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(kmmv1beta1.AddToScheme(s))
	// preflight reads Nodes (platforms, --from-node) and the Modules' pull secrets.
	utilruntime.Must(corev1.AddToScheme(s))
	return s
}

// noNMCMessage explains an empty cluster, as kubectl says "No resources found": not an error.
const noNMCMessage = "No (node, module) pairs: no NodeModulesConfig exists (no Module selects a node, or the kmm operator is not running).\n"

// session is a connection to the cluster: an uncached client and the namespace of the kubeconfig
// (or of -n).
type session struct {
	client    client.Client
	namespace string
	// config reaches the API server without the per-request timeout, for watches.
	config *rest.Config
	now    func() time.Time
}

// connect loads the kubeconfig as kubectl's connection flags say and builds a client.
func (o *rootOptions) connect() (*session, error) {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, fmt.Errorf("reading the namespace from the kubeconfig: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: pluginScheme()})
	if err != nil {
		return nil, fmt.Errorf("creating a client for %s: %w", cfg.Host, err)
	}
	watchConfig := rest.CopyConfig(cfg)
	watchConfig.Timeout = 0
	return &session{client: c, namespace: ns, config: watchConfig, now: time.Now}, nil
}

// statusView is what `status` prints.
type statusView struct {
	summaries []ModuleSummary
	rows      []PairRow
	noNMC     bool
	// resourceVersion is that of the NMC list, where status -w starts watching.
	resourceVersion string
}

// statusView reads the Modules and NMCs that filter selects.
func (s *session) statusView(ctx context.Context, filter moduleFilter) (*statusView, error) {
	modules, err := s.modules(ctx, filter)
	if err != nil {
		return nil, err
	}
	nmcs := &kmmv1beta1.NodeModulesConfigList{}
	if err := s.client.List(ctx, nmcs); err != nil {
		return nil, explain(err, "listing NodeModulesConfigs")
	}
	v := &statusView{rows: statusRows(nmcs.Items, filter, s.now()), noNMC: len(nmcs.Items) == 0,
		resourceVersion: nmcs.ResourceVersion}
	for i := range modules {
		v.summaries = append(v.summaries, summarize(&modules[i]))
	}
	return v, nil
}

// modules returns the Module filter names (an error when it does not exist), or those of its
// namespace, or all, sorted by namespace and name.
func (s *session) modules(ctx context.Context, filter moduleFilter) ([]kmmv1beta1.Module, error) {
	if filter.name != "" {
		m := &kmmv1beta1.Module{}
		err := s.client.Get(ctx, client.ObjectKey{Namespace: filter.namespace, Name: filter.name}, m)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("module %s/%s not found", filter.namespace, filter.name)
		}
		if err != nil {
			return nil, explain(err, "reading module "+filter.namespace+"/"+filter.name)
		}
		return []kmmv1beta1.Module{*m}, nil
	}
	list := &kmmv1beta1.ModuleList{}
	if err := s.client.List(ctx, list, client.InNamespace(filter.namespace)); err != nil {
		return nil, explain(err, "listing Modules")
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		return a.Namespace < b.Namespace || (a.Namespace == b.Namespace && a.Name < b.Name)
	})
	return list.Items, nil
}

// nmc reads the NodeModulesConfig of a node.
func (s *session) nmc(ctx context.Context, node string) (*kmmv1beta1.NodeModulesConfig, error) {
	nmc := &kmmv1beta1.NodeModulesConfig{}
	err := s.client.Get(ctx, client.ObjectKey{Name: node}, nmc)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("no NodeModulesConfig for node %s: no Module selects the node, or there is no such node "+
			"(kubectl get nmc lists the nodes kmm knows)", node)
	}
	if err != nil {
		return nil, explain(err, "reading the NodeModulesConfig of node "+node)
	}
	return nmc, nil
}

// explain turns the API errors a user can act on into messages that say what to do.
func explain(err error, doing string) error {
	switch {
	case meta.IsNoMatchError(err):
		return fmt.Errorf("%s: the kmm CRDs are not installed in this cluster: is kmm deployed? (%w)", doing, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w (kubectl kmm needs get and list on modules and nodemodulesconfigs of kmm.sigs.x-k8s.io)", doing, err)
	}
	return fmt.Errorf("%s: %w", doing, err)
}
