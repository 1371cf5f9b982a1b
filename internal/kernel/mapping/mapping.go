// Package mapping says what a Module asks of one node: whether the Module's selector selects the
// node (Selects) and, for the node's kernel, which of its kernel mappings applies and the worker
// config that mapping yields (Resolve: the image with its variables substituted, the mapping's
// overrides over the container's defaults). The Module→NMC decision (fsm.DecideSpec) and the
// preflight run this same code, so a preflight cannot disagree with what the nodes will get. It is
// pure apart from CompilePattern's cache of compiled regexps: no API client, no clock.
package mapping

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/kernel"
)

// The reasons Resolve gives with its error.
const (
	// ReasonNoKernelMapping: no kernel mapping matches the kernel.
	ReasonNoKernelMapping = kmmv1beta1.ReasonNoKernelMapping
	// ReasonInvalidKernel: the kernel version does not parse.
	ReasonInvalidKernel = "InvalidKernelVersion"
	// ReasonInvalidSpec: a mapping or the image cannot be evaluated.
	ReasonInvalidSpec = kmmv1beta1.ReasonInvalidSpec
	// ReasonDevicePluginOnly: the Module has no module loader; nothing is loaded on any node.
	ReasonDevicePluginOnly = "DevicePluginOnly"
)

// Selects says whether m's selector selects a node with these labels (an empty selector selects
// none).
func Selects(m *kmmv1beta1.Module, nodeLabels map[string]string) bool {
	return len(m.Spec.Selector) > 0 && labels.SelectorFromSet(m.Spec.Selector).Matches(labels.Set(nodeLabels))
}

// Resolve is the worker config of m for a node running kernel kver (SPEC §5): the first matching
// kernel mapping, its image with variables substituted, and the mapping's overrides. The reason
// is ReasonNoKernelMapping, ReasonInvalidKernel, ReasonInvalidSpec or ReasonDevicePluginOnly on
// error.
func Resolve(m *kmmv1beta1.Module, kver string) (kmmv1beta1.ModuleConfig, string, error) {
	if m.Spec.DevicePluginOnly() {
		return kmmv1beta1.ModuleConfig{}, ReasonDevicePluginOnly, fmt.Errorf("the Module has no moduleLoader")
	}
	v, err := kernel.Parse(kver)
	if err != nil {
		return kmmv1beta1.ModuleConfig{}, ReasonInvalidKernel, err
	}
	c := &m.Spec.ModuleLoader.Container
	km, err := find(c.KernelMappings, v)
	if err != nil {
		return kmmv1beta1.ModuleConfig{}, ReasonInvalidSpec, err
	}
	if km == nil {
		return kmmv1beta1.ModuleConfig{}, ReasonNoKernelMapping, fmt.Errorf("no kernel mapping matches kernel %s", v.Full)
	}
	image := km.ContainerImage
	if image == "" {
		image = c.ContainerImage
	}
	image, err = kernel.ExpandImage(image, v, m.Name, m.Namespace)
	if err != nil {
		return kmmv1beta1.ModuleConfig{}, ReasonInvalidSpec, err
	}
	return moduleConfig(c, km, v.Full, image), "", nil
}

// find returns the first mapping matching v (nil when none), or an error for a mapping that
// cannot be evaluated.
func find(mappings []kmmv1beta1.KernelMapping, v kernel.Version) (*kmmv1beta1.KernelMapping, error) {
	for i := range mappings {
		ok, err := matches(&mappings[i], v)
		if err != nil {
			return nil, fmt.Errorf("kernelMappings[%d]: %w", i, err)
		}
		if ok {
			return &mappings[i], nil
		}
	}
	return nil, nil
}

func matches(km *kmmv1beta1.KernelMapping, v kernel.Version) (bool, error) {
	switch {
	case km.Literal != "":
		return km.Literal == v.Full, nil
	case km.Regexp != "":
		re, err := CompilePattern(km.Regexp)
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

// Recipe is how m makes its image for a node running kernel kver when the image is missing: the
// build and the sign of the kernel mapping that serves kver, each over the container's, as
// upstream merges them (both nil: the image is only pulled).
func Recipe(m *kmmv1beta1.Module, kver string) (*kmmv1beta1.Build, *kmmv1beta1.Sign) {
	if m.Spec.DevicePluginOnly() {
		return nil, nil
	}
	v, err := kernel.Parse(kver)
	if err != nil {
		return nil, nil
	}
	c := &m.Spec.ModuleLoader.Container
	km, err := find(c.KernelMappings, v)
	if err != nil || km == nil {
		return nil, nil
	}
	b, s := c.Build, c.Sign
	if km.Build != nil {
		b = km.Build
	}
	if km.Sign != nil {
		s = km.Sign
	}
	return b, s
}

// HasRecipe says whether m has a build or a sign anywhere (container or mapping).
func HasRecipe(m *kmmv1beta1.Module) bool {
	if m.Spec.DevicePluginOnly() {
		return false
	}
	c := &m.Spec.ModuleLoader.Container
	if c.Build != nil || c.Sign != nil {
		return true
	}
	for i := range c.KernelMappings {
		if c.KernelMappings[i].Build != nil || c.KernelMappings[i].Sign != nil {
			return true
		}
	}
	return false
}

// Expand substitutes the kernel and Module variables of an image reference (or a path) for a node
// running kernel kver, as the mapping's containerImage is.
func Expand(m *kmmv1beta1.Module, kver, s string) (string, error) {
	v, err := kernel.Parse(kver)
	if err != nil {
		return "", err
	}
	return kernel.ExpandImage(s, v, m.Name, m.Namespace)
}
