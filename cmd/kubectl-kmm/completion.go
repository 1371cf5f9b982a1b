package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

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
