package main

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// completionTimeout bounds the API requests of a shell completion.
const completionTimeout = 5 * time.Second

// completeModules completes the Module argument of status from the cluster: "<namespace>/<name>",
// or the name alone with -n.
func (o *rootOptions) completeModules(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return o.moduleNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
}

// completeHistory completes history's node (the NodeModulesConfigs) and then its Module.
func (o *rootOptions) completeHistory(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return o.nodeNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
	case 1:
		return o.moduleNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

func (o *rootOptions) moduleNames(ctx context.Context) []string {
	ctx, cancel := completionContext(ctx)
	defer cancel()
	s, err := o.connect()
	if err != nil {
		return nil
	}
	ns := *o.config.Namespace
	modules, err := s.modules(ctx, moduleFilter{namespace: ns})
	if err != nil {
		return nil
	}
	var names []string
	for _, m := range modules {
		if ns != "" {
			names = append(names, m.Name)
		} else {
			names = append(names, m.Namespace+"/"+m.Name)
		}
	}
	return names
}

func (o *rootOptions) nodeNames(ctx context.Context) []string {
	ctx, cancel := completionContext(ctx)
	defer cancel()
	s, err := o.connect()
	if err != nil {
		return nil
	}
	list := &kmmv1beta1.NodeModulesConfigList{}
	if err := s.client.List(ctx, list); err != nil {
		return nil
	}
	var names []string
	for _, n := range list.Items {
		names = append(names, n.Name)
	}
	return names
}

func completionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithTimeout(ctx, completionTimeout)
}

// registerFlagCompletions completes the connection flags whose values the kubeconfig or the
// cluster knows: --context, --cluster and --user from the kubeconfig, -n from the namespaces that
// hold Modules.
func (o *rootOptions) registerFlagCompletions(cmd *cobra.Command) {
	fromKubeconfig := func(names func(api *clientcmdapi.Config) []string) cobra.CompletionFunc {
		return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			raw, err := o.config.ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return names(&raw), cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = cmd.RegisterFlagCompletionFunc("context", fromKubeconfig(func(c *clientcmdapi.Config) []string { return slices.Sorted(maps.Keys(c.Contexts)) }))
	_ = cmd.RegisterFlagCompletionFunc("cluster", fromKubeconfig(func(c *clientcmdapi.Config) []string { return slices.Sorted(maps.Keys(c.Clusters)) }))
	_ = cmd.RegisterFlagCompletionFunc("user", fromKubeconfig(func(c *clientcmdapi.Config) []string { return slices.Sorted(maps.Keys(c.AuthInfos)) }))
	_ = cmd.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
		return o.moduleNamespaces(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
	})
}

// moduleNamespaces are the namespaces that hold Modules, sorted.
func (o *rootOptions) moduleNamespaces(ctx context.Context) []string {
	ctx, cancel := completionContext(ctx)
	defer cancel()
	s, err := o.connect()
	if err != nil {
		return nil
	}
	modules, err := s.modules(ctx, moduleFilter{})
	if err != nil {
		return nil
	}
	var names []string
	for _, m := range modules {
		if len(names) == 0 || names[len(names)-1] != m.Namespace {
			names = append(names, m.Namespace)
		}
	}
	return names
}
