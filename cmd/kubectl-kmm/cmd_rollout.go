package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// rolloutOptions are the flags of `kubectl kmm rollout`.
type rolloutOptions struct {
	*rootOptions
	output string
}

// newRolloutCommand is `kubectl kmm rollout status|pause|resume|undo <module>`: what the rollout
// controller wrote in status.rollout, and the user's three switches, spec.upgradePolicy.paused and
// the rollout-resume and rollout-undo annotations.
func newRolloutCommand(root *rootOptions) *cobra.Command {
	o := &rolloutOptions{rootOptions: root}
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "The automatic rollout of a Module's version: status, pause, resume, undo",
		Long: "The automatic rollout of a Module's version (spec.upgradePolicy.automatic): its nodes per\n" +
			"upgrade state, its budgets and pause, the failed nodes with their reasons (status); stop starting\n" +
			"nodes (pause); go on after a pause, by the user or at the failure budget (resume); send every node\n" +
			"back to the version it ran before (undo).",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(o.streams.ErrOut)
			_ = cmd.Usage()
			return errors.New("missing command: status, pause, resume or undo")
		},
	}
	one := func(use, short, example string, run func(context.Context, *session, moduleFilter) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " [<namespace>/<module> | <module>]", Short: short, Example: example,
			Args: func(_ *cobra.Command, args []string) error {
				if len(args) != 1 {
					return fmt.Errorf("rollout %s needs one module: kubectl kmm rollout %s <namespace>/<module>", use, use)
				}
				return nil
			},
			ValidArgsFunction: root.completeModules,
			RunE: func(cmd *cobra.Command, args []string) error {
				s, err := o.connect()
				if err != nil {
					return err
				}
				f, err := moduleArg(args[0], s.namespace)
				if err != nil {
					return err
				}
				return run(cmd.Context(), s, f)
			},
		}
	}
	status := one("status", "Nodes per upgrade state, budgets, pause and failed nodes of a Module's rollout",
		"  kubectl kmm rollout status drivers/nic\n  kubectl kmm rollout status nic -n drivers -o yaml", o.status)
	status.Flags().StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (status.rollout as the operator wrote it); default a table.")
	cmd.AddCommand(status,
		one("pause", "Start no more nodes (sets spec.upgradePolicy.paused); nodes already upgrading finish",
			"  kubectl kmm rollout pause drivers/nic", o.pause),
		one("resume", "Go on after a pause, by the user or at the failure budget",
			"  kubectl kmm rollout resume drivers/nic", o.resume),
		one("undo", "Send every node back to the previous version (status.rollout.previous), maxUnavailable at a time",
			"  kubectl kmm rollout undo drivers/nic", o.undo))
	return cmd
}

// status prints the Module's status.rollout.
func (o *rolloutOptions) status(ctx context.Context, s *session, f moduleFilter) error {
	m, err := s.rolloutModule(ctx, f)
	if err != nil {
		return err
	}
	out := o.streams.Out
	switch o.output {
	case "json":
		data, err := json.MarshalIndent(m.Status.Rollout, "", "    ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", data)
		return err
	case "yaml":
		data, err := yaml.Marshal(m.Status.Rollout)
		if err != nil {
			return err
		}
		_, err = out.Write(data)
		return err
	case "":
		_, err = io.WriteString(out, renderRollout(m, s.now(), o.tableWidth()))
		return err
	}
	return fmt.Errorf("unknown output format %q: rollout status prints a table, json or yaml", o.output)
}

// pause sets spec.upgradePolicy.paused.
func (o *rolloutOptions) pause(ctx context.Context, s *session, f moduleFilter) error {
	if _, err := s.rolloutModule(ctx, f); err != nil {
		return err
	}
	patch := map[string]any{"spec": map[string]any{"upgradePolicy": map[string]any{"paused": true}}}
	if err := s.patchModule(ctx, f, patch); err != nil {
		return err
	}
	_, err := fmt.Fprintf(o.streams.Out, "module %s/%s: rollout paused (nodes already upgrading finish)\n", f.namespace, f.name)
	return err
}

// resume clears spec.upgradePolicy.paused and sets the rollout-resume annotation to the time, a
// value the controller has not observed: a pause at the failure budget lifts once, and the nodes
// failed now no longer count against it.
func (o *rolloutOptions) resume(ctx context.Context, s *session, f moduleFilter) error {
	if _, err := s.rolloutModule(ctx, f); err != nil {
		return err
	}
	patch := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{kmmv1beta1.RolloutResumeAnnotation: s.now().UTC().Format(time.RFC3339Nano)}},
		"spec":     map[string]any{"upgradePolicy": map[string]any{"paused": nil}},
	}
	if err := s.patchModule(ctx, f, patch); err != nil {
		return err
	}
	_, err := fmt.Fprintf(o.streams.Out, "module %s/%s: rollout resumed\n", f.namespace, f.name)
	return err
}

// undo sets the rollout-undo annotation to the time, a value the controller has not observed: every
// node of the rollout goes back to status.rollout.previous's version through the ordered path,
// maxUnavailable at a time, until the Module's version changes or the rollout is resumed. It
// refuses when no previous version with a config is known.
func (o *rolloutOptions) undo(ctx context.Context, s *session, f moduleFilter) error {
	m, err := s.rolloutModule(ctx, f)
	if err != nil {
		return err
	}
	st := m.Status.Rollout
	if st == nil || st.Version != m.Spec.Version() || st.Previous == nil || st.Previous.Version == m.Spec.Version() || len(st.Previous.Configs) == 0 {
		return fmt.Errorf("module %s/%s: no previous version to go back to is known (status.rollout.previous); "+
			"set spec.moduleLoader.container.version (and its kernel mappings) back instead", f.namespace, f.name)
	}
	patch := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{kmmv1beta1.RolloutUndoAnnotation: s.now().UTC().Format(time.RFC3339Nano)}},
	}
	if err := s.patchModule(ctx, f, patch); err != nil {
		return err
	}
	_, err = fmt.Fprintf(o.streams.Out, "module %s/%s: rollout undone: every node goes back to %s, maxUnavailable at a time; "+
		"set the Module's version to %s to keep it there, or kubectl kmm rollout resume to roll %s out again\n",
		f.namespace, f.name, st.Previous.Version, st.Previous.Version, m.Spec.Version())
	return err
}

// rolloutModule reads a Module whose version the operator rolls out itself.
func (s *session) rolloutModule(ctx context.Context, f moduleFilter) (*kmmv1beta1.Module, error) {
	m := &kmmv1beta1.Module{}
	err := s.client.Get(ctx, client.ObjectKey{Namespace: f.namespace, Name: f.name}, m)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("module %s/%s not found", f.namespace, f.name)
	}
	if err != nil {
		return nil, explain(err, "reading module "+f.namespace+"/"+f.name)
	}
	if m.Spec.UpgradePolicy == nil || !m.Spec.UpgradePolicy.Automatic {
		return nil, fmt.Errorf("module %s/%s has no automatic rollout (spec.upgradePolicy.automatic is not true): "+
			"its nodes move when their version-module label does", f.namespace, f.name)
	}
	return m, nil
}

// patchModule merge-patches a Module.
func (s *session) patchModule(ctx context.Context, f moduleFilter, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	m := &kmmv1beta1.Module{}
	m.Namespace, m.Name = f.namespace, f.name
	if err := s.client.Patch(ctx, m, client.RawPatch(types.MergePatchType, data)); err != nil {
		return explain(err, "patching module "+f.namespace+"/"+f.name)
	}
	return nil
}
