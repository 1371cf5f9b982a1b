package fsm

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/kernel"
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
	ReasonNoKernelMapping = kmmv1beta1.ReasonNoKernelMapping
	ReasonInvalidKernel   = "InvalidKernelVersion"
	ReasonInvalidSpec     = kmmv1beta1.ReasonInvalidSpec
	ReasonVersionPending  = "VersionLabelOlder"
	ReasonVersionMissing  = "VersionLabelMissing"
	ReasonDesired         = "Desired"
	// ReasonDevicePluginOnly: the Module has no module loader; nothing is loaded on any node.
	ReasonDevicePluginOnly = "DevicePluginOnly"
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
	if !Selects(m, node.Labels) {
		return SpecDecision{Action: SpecDelete, Reason: ReasonNotSelected}
	}
	if m.Spec.DevicePluginOnly() {
		return SpecDecision{Action: SpecDelete, Reason: ReasonDevicePluginOnly}
	}
	entry, reason, err := ResolveEntry(m, node.KernelVersion)
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
		return SpecDecision{Action: SpecKeep, Reason: ReasonVersionPending,
			Message: fmt.Sprintf("node is at version %s, the Module at %s", label, version)}
	}
	return SpecDecision{Action: SpecUpdate, Entry: entry, Reason: ReasonDesired}
}

// Selects says whether m's selector selects a node with these labels (an empty selector selects
// none).
func Selects(m *kmmv1beta1.Module, nodeLabels map[string]string) bool {
	return len(m.Spec.Selector) > 0 && labels.SelectorFromSet(m.Spec.Selector).Matches(labels.Set(nodeLabels))
}

// ResolveEntry builds the spec entry of m for a node running kernel kver (SPEC §5): the first
// matching kernel mapping, its image with variables substituted, and the mapping's overrides.
// The reason is ReasonNoKernelMapping, ReasonInvalidKernel or ReasonInvalidSpec on error.
func ResolveEntry(m *kmmv1beta1.Module, kver string) (*kmmv1beta1.NodeModuleSpec, string, error) {
	if m.Spec.DevicePluginOnly() {
		return nil, ReasonDevicePluginOnly, fmt.Errorf("the Module has no moduleLoader")
	}
	v, err := kernel.Parse(kver)
	if err != nil {
		return nil, ReasonInvalidKernel, err
	}
	c := &m.Spec.ModuleLoader.Container
	km, err := findMapping(c.KernelMappings, v)
	if err != nil {
		return nil, ReasonInvalidSpec, err
	}
	if km == nil {
		return nil, ReasonNoKernelMapping, fmt.Errorf("no kernel mapping matches kernel %s", v.Full)
	}
	image := km.ContainerImage
	if image == "" {
		image = c.ContainerImage
	}
	image, err = kernel.ExpandImage(image, v, m.Name, m.Namespace)
	if err != nil {
		return nil, ReasonInvalidSpec, err
	}
	return &kmmv1beta1.NodeModuleSpec{
		Namespace:          m.Namespace,
		Name:               m.Name,
		Config:             moduleConfig(c, km, v.Full, image),
		ServiceAccountName: m.Spec.ModuleLoader.ServiceAccountName,
		ImageRepoSecret:    m.Spec.ImageRepoSecret.DeepCopy(),
		Tolerations:        copyTolerations(m.Spec.Tolerations),
	}, "", nil
}

// findMapping returns the first mapping matching v (nil when none), or an error for a mapping that
// cannot be evaluated.
func findMapping(mappings []kmmv1beta1.KernelMapping, v kernel.Version) (*kmmv1beta1.KernelMapping, error) {
	for i := range mappings {
		ok, err := mappingMatches(&mappings[i], v)
		if err != nil {
			return nil, fmt.Errorf("kernelMappings[%d]: %w", i, err)
		}
		if ok {
			return &mappings[i], nil
		}
	}
	return nil, nil
}

func mappingMatches(km *kmmv1beta1.KernelMapping, v kernel.Version) (bool, error) {
	switch {
	case km.Literal != "":
		return km.Literal == v.Full, nil
	case km.Regexp != "":
		re, err := compilePattern(km.Regexp)
		if err != nil {
			return false, err
		}
		return re.MatchString(v.Full), nil
	case km.VersionRange != "":
		r, err := kernel.ParseRange(km.VersionRange)
		if err != nil {
			return false, err
		}
		return r.Contains(v), nil
	}
	return false, nil
}

// moduleConfig assembles the worker config from the container defaults and the mapping overrides.
func moduleConfig(c *kmmv1beta1.ModuleLoaderContainerSpec, km *kmmv1beta1.KernelMapping, kver, image string) kmmv1beta1.ModuleConfig {
	cfg := kmmv1beta1.ModuleConfig{
		KernelVersion:   kver,
		ContainerImage:  image,
		ImagePullPolicy: c.ImagePullPolicy,
		RegistryTLS:     c.RegistryTLS,
		Modprobe:        *c.Modprobe.DeepCopy(),
		Version:         c.Version,
	}
	if km.RegistryTLS != nil {
		cfg.RegistryTLS = *km.RegistryTLS
	}
	if cfg.Modprobe.DirName == "" {
		cfg.Modprobe.DirName = contract.DefaultDirName
	}
	cfg.InTreeModulesToRemove = inTreeModules(c.InTreeModulesToRemove, c.InTreeModuleToRemove)
	if len(km.InTreeModulesToRemove) > 0 || km.InTreeModuleToRemove != "" {
		cfg.InTreeModulesToRemove = inTreeModules(km.InTreeModulesToRemove, km.InTreeModuleToRemove)
	}
	return cfg
}

// inTreeModules merges the list field with upstream's deprecated single-module field.
func inTreeModules(list []string, single string) []string {
	out := append([]string(nil), list...)
	if single != "" && !slices.Contains(out, single) {
		out = append(out, single)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
