package image

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// desiredSpec is the MIC spec of m for the nodes it selects (pure): one entry per image a selected
// node's kernel needs whose mapping has a build or a sign, sorted by image, at most
// kmmv1beta1.MaxMICImages. Images without a recipe are not the image controller's business: the
// worker pulls them as they are.
//
// aheadKernels are the kernels of the PreflightValidations with pushBuiltImage: the images of the
// Module's mappings for them are made too, ahead of the upgrade, whatever the nodes run today.
func desiredSpec(m *kmmv1beta1.Module, nodes []corev1.Node, aheadKernels []string) kmmv1beta1.ModuleImagesConfigSpec {
	spec := kmmv1beta1.ModuleImagesConfigSpec{
		ImageRepoSecret:               m.Spec.ImageRepoSecret.DeepCopy(),
		ImagePullPolicy:               corev1.PullIfNotPresent,
		ImageRebuildTriggerGeneration: copyGen(m.Spec.ImageRebuildTriggerGeneration),
		Tolerations:                   slices.Clone(m.Spec.Tolerations),
	}
	if m.Spec.ModuleLoader != nil && m.Spec.ModuleLoader.Container.ImagePullPolicy != "" {
		spec.ImagePullPolicy = m.Spec.ModuleLoader.Container.ImagePullPolicy
	}
	seen := map[string]bool{}
	for i := range nodes {
		n := &nodes[i]
		kver := n.Status.NodeInfo.KernelVersion
		if !mapping.Selects(m, n.Labels) || kver == "" {
			continue
		}
		e, ok := imageSpec(m, kver)
		if !ok || seen[e.Image] {
			continue
		}
		seen[e.Image] = true
		spec.Images = append(spec.Images, e)
	}
	for _, kver := range aheadKernels {
		if e, ok := imageSpec(m, kver); ok && !seen[e.Image] {
			seen[e.Image] = true
			spec.Images = append(spec.Images, e)
		}
	}
	slices.SortFunc(spec.Images, func(a, b kmmv1beta1.ModuleImageSpec) int { return strings.Compare(a.Image, b.Image) })
	if len(spec.Images) > kmmv1beta1.MaxMICImages {
		spec.Images = spec.Images[:kmmv1beta1.MaxMICImages]
	}
	return spec
}

// imageSpec is the MIC spec entry of m for kernel kver, when its mapping has a recipe.
func imageSpec(m *kmmv1beta1.Module, kver string) (kmmv1beta1.ModuleImageSpec, bool) {
	cfg, _, err := mapping.Resolve(m, kver)
	if err != nil {
		return kmmv1beta1.ModuleImageSpec{}, false
	}
	b, s := mapping.Recipe(m, kver)
	if b == nil && s == nil {
		return kmmv1beta1.ModuleImageSpec{}, false
	}
	tls := cfg.RegistryTLS
	return kmmv1beta1.ModuleImageSpec{
		Image:         cfg.ContainerImage,
		KernelVersion: cfg.KernelVersion,
		Build:         b.DeepCopy(),
		Sign:          s.DeepCopy(),
		RegistryTLS:   &tls,
		DirName:       cfg.Modprobe.DirName,
	}, true
}

func copyGen(g *int64) *int64 {
	if g == nil {
		return nil
	}
	v := *g
	return &v
}
