package fsm

import (
	"fmt"
	"slices"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// NodeView is a node as the controllers see it. The Module→NMC decision may read only Name,
// Labels and KernelVersion; the rest is there so that tests can prove it does not read it.
type NodeView struct {
	Name          string
	Labels        map[string]string
	KernelVersion string
	Ready         bool
	Unschedulable bool
	BootID        string
}

// SpecAction is what the Module→NMC decision does with a node's spec entry for a Module.
type SpecAction string

// The spec actions of seed 000.
const (
	// SpecKeep leaves the entry as it is (no mapping for the kernel, or an old version in place).
	SpecKeep SpecAction = "Keep"
	// SpecUpdate writes Entry.
	SpecUpdate SpecAction = "Update"
	// SpecDelete removes the entry.
	SpecDelete SpecAction = "Delete"
)

// Reasons the decision gives.
const (
	ReasonModuleDeleted   = "ModuleDeleted"
	ReasonNotSelected     = "NotSelected"
	ReasonNoKernelMapping = mapping.ReasonNoKernelMapping
	ReasonInvalidKernel   = mapping.ReasonInvalidKernel
	ReasonInvalidSpec     = mapping.ReasonInvalidSpec
	ReasonVersionPending  = "VersionLabelOlder"
	ReasonVersionMissing  = "VersionLabelMissing"
	ReasonDesired         = "Desired"
	// ReasonRollback: the node goes back to the previous version of a rollback (status.rollout.rollback).
	ReasonRollback = "Rollback"
	// ReasonDevicePluginOnly: the Module has no module loader; nothing is loaded on any node.
	ReasonDevicePluginOnly = mapping.ReasonDevicePluginOnly
)

// SpecDecision is the Module→NMC decision for one (Module, node).
type SpecDecision struct {
	Action SpecAction
	// Entry is the entry to write, for SpecUpdate.
	Entry *kmmv1beta1.NodeModuleSpec
	// Reason says why, for status and logs.
	Reason  string
	Message string
}

// DecideSpec is the Module→NMC decision of seed 000: whether node's NMC spec should hold an entry
// for m, and which. It reads the node's labels and kernel only, never its status (SPEC §3).
func DecideSpec(m *kmmv1beta1.Module, node NodeView) SpecDecision {
	if !m.DeletionTimestamp.IsZero() {
		return SpecDecision{Action: SpecDelete, Reason: ReasonModuleDeleted}
	}
	if !mapping.Selects(m, node.Labels) {
		return SpecDecision{Action: SpecDelete, Reason: ReasonNotSelected}
	}
	if m.Spec.DevicePluginOnly() {
		return SpecDecision{Action: SpecDelete, Reason: ReasonDevicePluginOnly}
	}
	entry, reason, err := resolveEntry(m, node.KernelVersion)
	if err != nil {
		return SpecDecision{Action: SpecKeep, Reason: reason, Message: err.Error()}
	}
	version := m.Spec.Version()
	if version == "" {
		return SpecDecision{Action: SpecUpdate, Entry: entry, Reason: ReasonDesired}
	}
	switch label, ok := node.Labels[kmmv1beta1.WorkerPodVersionLabel(m.Namespace, m.Name)]; {
	case !ok:
		return SpecDecision{Action: SpecDelete, Reason: ReasonVersionMissing}
	case label != version:
		if entry := previousEntry(m, node, label); entry != nil {
			return SpecDecision{Action: SpecUpdate, Entry: entry, Reason: ReasonRollback}
		}
		return SpecDecision{Action: SpecKeep, Reason: ReasonVersionPending,
			Message: fmt.Sprintf("node is at version %s, the Module at %s", label, version)}
	}
	return SpecDecision{Action: SpecUpdate, Entry: entry, Reason: ReasonDesired}
}

// resolveEntry builds the spec entry of m for a node running kernel kver (SPEC §5): the worker
// config of the kernel mapping that serves kver (mapping.Resolve), and the Module's service
// account, pull secret and tolerations. The reason is mapping's on error.
func resolveEntry(m *kmmv1beta1.Module, kver string) (*kmmv1beta1.NodeModuleSpec, string, error) {
	cfg, reason, err := mapping.Resolve(m, kver)
	if err != nil {
		return nil, reason, err
	}
	return &kmmv1beta1.NodeModuleSpec{
		Namespace:          m.Namespace,
		Name:               m.Name,
		Config:             cfg,
		ServiceAccountName: m.Spec.ModuleLoader.ServiceAccountName,
		ImageRepoSecret:    m.Spec.ImageRepoSecret.DeepCopy(),
		Tolerations:        copyTolerations(m.Spec.Tolerations),
		Hooks:              m.Spec.ModuleLoader.Hooks.DeepCopy(),
	}, "", nil
}

// previousEntry is the entry of the previous version for a node whose version-worker-pod label
// names it while the Module's rollout rolls the node back (status.rollout.rollback of the Module's
// version, for every node or this one): the config status.rollout.previous keeps for the node's
// kernel, with the worker pod settings that loaded it. Nil otherwise: the entry is kept as it is.
func previousEntry(m *kmmv1beta1.Module, node NodeView, label string) *kmmv1beta1.NodeModuleSpec {
	st := m.Status.Rollout
	if st == nil || st.Version != m.Spec.Version() || st.Rollback == nil || st.Previous == nil ||
		st.Rollback.Version != label || st.Previous.Version != label ||
		(st.Rollback.Reason != kmmv1beta1.ReasonRollbackUndo && !slices.Contains(st.Rollback.Nodes, node.Name)) {
		return nil
	}
	for i := range st.Previous.Configs {
		c := &st.Previous.Configs[i]
		if c.Config.KernelVersion == node.KernelVersion {
			return &kmmv1beta1.NodeModuleSpec{Namespace: m.Namespace, Name: m.Name, Config: *c.Config.DeepCopy(),
				ServiceAccountName: c.ServiceAccountName, ImageRepoSecret: c.ImageRepoSecret.DeepCopy(), Tolerations: copyTolerations(c.Tolerations)}
		}
	}
	return nil
}
