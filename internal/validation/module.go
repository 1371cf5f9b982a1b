package validation

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel"
)

// sampleKernel is the kernel used to check that image references with variables parse.
var sampleKernel = kernel.Version{Full: "5.14.0-1.el9.x86_64", Release: []int{5, 14, 0}, Build: 1, HasBuild: true}

// Module is the controllers' re-check of a Module before they act on it: every rule of admission
// (Admission), so that an object that got in anyway is caught. Everything admission accepts, kmm
// carries out (build and sign since issue 37's image controller).
func Module(m *kmmv1beta1.Module) field.ErrorList {
	return Admission(m)
}

// Admission checks every rule of a Module that admission enforces, whether the CRD schema or the
// validating webhook enforces it.
func Admission(m *kmmv1beta1.Module) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if len(m.Spec.Selector) == 0 {
		errs = append(errs, field.Required(spec.Child("selector"), "selector must not be empty: name the node labels of the nodes that need the module"))
	}
	errs = append(errs, validateNameBudget(m)...)
	switch ml := m.Spec.ModuleLoader; {
	case ml != nil:
		errs = append(errs, validateModuleLoader(m, spec.Child("moduleLoader"), ml)...)
	case m.Spec.DevicePlugin == nil && m.Spec.DRA == nil:
		errs = append(errs, field.Required(spec.Child("moduleLoader"), "moduleLoader is required unless devicePlugin or dra is set (a device-plugin-only Module)"))
	}
	errs = append(errs, validateDevicePlugin(m, spec.Child("devicePlugin"))...)
	errs = append(errs, validateDRA(m, spec.Child("dra"))...)
	errs = append(errs, validateUpgradePolicy(spec.Child("upgradePolicy"), m.Spec.UpgradePolicy)...)
	errs = append(errs, validateSelector(spec.Child("selector"), m.Spec.Selector)...)
	errs = append(errs, validateTolerations(spec.Child("tolerations"), m.Spec.Tolerations)...)
	if dp := m.Spec.DevicePlugin; dp != nil {
		errs = append(errs, validateServiceAccount(spec.Child("devicePlugin", "serviceAccountName"), dp.ServiceAccountName)...)
	}
	return errs
}

// validateNameBudget checks that namespace and name fit in the node label keys kmm derives.
func validateNameBudget(m *kmmv1beta1.Module) field.ErrorList {
	if n := len(m.Namespace) + len(m.Name); n > kmmv1beta1.MaxNameLength {
		return field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), m.Name, fmt.Sprintf(
			"len(namespace)+len(name) must be at most %d because both go into node label keys; it is %d",
			kmmv1beta1.MaxNameLength, n))}
	}
	return nil
}

// validateModuleLoader checks the worker side of a Module: images, mappings, modprobe.
func validateModuleLoader(m *kmmv1beta1.Module, p *field.Path, ml *kmmv1beta1.ModuleLoaderSpec) field.ErrorList {
	var errs field.ErrorList
	container := p.Child("container")
	c := &ml.Container
	if c.ContainerImage != "" {
		errs = append(errs, validateImage(m, container.Child("containerImage"), c.ContainerImage)...)
	}
	errs = append(errs, validatePullPolicy(container.Child("imagePullPolicy"), c.ImagePullPolicy)...)
	errs = append(errs, validateKernelMappings(m, container.Child("kernelMappings"), c)...)
	errs = append(errs, validateModprobe(container.Child("modprobe"), &c.Modprobe)...)
	errs = append(errs, validateServiceAccount(p.Child("serviceAccountName"), ml.ServiceAccountName)...)
	errs = append(errs, validateHooks(p.Child("hooks"), ml.Hooks)...)
	return append(errs, validateBuildAndSign(m, container, c)...)
}

// validateHooks checks the host paths of the Module's hooks (the CRD's pattern, again): the
// device plugin's prefixes, no "." or ".." segment.
func validateHooks(p *field.Path, h *kmmv1beta1.ModuleHooks) field.ErrorList {
	if h == nil {
		return nil
	}
	var errs field.ErrorList
	for _, named := range []struct {
		name string
		hook *kmmv1beta1.ModuleHook
	}{{"postLoad", h.PostLoad}, {"preUnload", h.PreUnload}} {
		name, hook := named.name, named.hook
		if hook == nil {
			continue
		}
		for i, hp := range hook.HostPaths {
			if !kmmv1beta1.DevicePluginHostPathAllowed(hp) || slices.Contains(strings.Split(hp, "/"), ".") || strings.HasSuffix(hp, "/") {
				errs = append(errs, field.Invalid(p.Child(name, "hostPaths").Index(i), hp,
					"a hook may mount host paths only under /dev, /sys, /var, /opt or /run, without '.' or '..' segments"))
			}
		}
	}
	return errs
}

// ModuleUpdate checks the rules of Admission and those that compare a Module with its previous
// revision.
func ModuleUpdate(m, old *kmmv1beta1.Module) field.ErrorList {
	errs := Admission(m)
	oldVersion, newVersion := old.Spec.Version(), m.Spec.Version()
	versionPath := field.NewPath("spec", "moduleLoader", "container", "version")
	if (oldVersion == "") != (newVersion == "") {
		errs = append(errs, field.Invalid(versionPath, newVersion,
			"version cannot be added to or removed from an existing Module: delete and recreate the Module"))
	}
	// Seed 002: with ordered upgrades, the images and the version change together, atomically.
	imagesChanged := !slices.Equal(images(old), images(m))
	if oldVersion != "" && newVersion != "" && (oldVersion != newVersion) != imagesChanged {
		msg := "the version changed but no kmod image did: change the images and the version in the same update"
		if imagesChanged {
			msg = "a kmod image changed but the version did not: with ordered upgrades, change the images and the version together"
		}
		errs = append(errs, field.Invalid(versionPath, newVersion, msg))
	}
	return errs
}

// images lists the kmod image references of a Module (the default, then each mapping's).
func images(m *kmmv1beta1.Module) []string {
	if m.Spec.ModuleLoader == nil {
		return nil
	}
	c := &m.Spec.ModuleLoader.Container
	out := []string{c.ContainerImage}
	for _, km := range c.KernelMappings {
		out = append(out, km.ContainerImage)
	}
	return out
}

func validateKernelMappings(m *kmmv1beta1.Module, p *field.Path, c *kmmv1beta1.ModuleLoaderContainerSpec) field.ErrorList {
	var errs field.ErrorList
	if len(c.KernelMappings) == 0 {
		errs = append(errs, field.Required(p, "at least one kernel mapping is required"))
	}
	for i := range c.KernelMappings {
		errs = append(errs, validateKernelMapping(m, p.Index(i), &c.KernelMappings[i], c.ContainerImage)...)
	}
	return errs
}

func validateKernelMapping(m *kmmv1beta1.Module, p *field.Path, km *kmmv1beta1.KernelMapping, defaultImage string) field.ErrorList {
	var errs field.ErrorList
	set := 0
	for _, s := range []string{km.Literal, km.Regexp, km.VersionRange} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		errs = append(errs, field.Invalid(p, fmt.Sprintf("%d matchers set", set), "exactly one of literal, regexp or versionRange must be set"))
	}
	if km.Regexp != "" {
		if _, err := kernel.CompilePattern(km.Regexp); err != nil {
			errs = append(errs, field.Invalid(p.Child("regexp"), km.Regexp, "not a valid Go regular expression within kmm's bounds: "+err.Error()))
		}
	}
	if km.VersionRange != "" {
		if _, err := kernel.ParseRange(km.VersionRange); err != nil {
			errs = append(errs, field.Invalid(p.Child("versionRange"), km.VersionRange, "not a valid version range: "+err.Error()))
		}
	}
	switch {
	case km.ContainerImage != "":
		errs = append(errs, validateImage(m, p.Child("containerImage"), km.ContainerImage)...)
	case defaultImage == "":
		errs = append(errs, field.Required(p.Child("containerImage"), "every kernelMapping needs a containerImage when container.containerImage is not set"))
	}
	return errs
}

// validateImage checks that an image reference, with its variables substituted, parses and names a
// tag or a digest.
func validateImage(m *kmmv1beta1.Module, p *field.Path, image string) field.ErrorList {
	expanded, err := kernel.ExpandImage(image, sampleKernel, m.Name, m.Namespace)
	if err != nil {
		return field.ErrorList{field.Invalid(p, image, err.Error())}
	}
	return validateImageReference(p, image, expanded)
}

func validateImageReference(p *field.Path, image, expanded string) field.ErrorList {
	if _, err := name.ParseReference(expanded, name.WeakValidation); err != nil {
		return field.ErrorList{field.Invalid(p, image, "not a valid image reference: "+err.Error())}
	}
	if !hasTagOrDigest(expanded) {
		return field.ErrorList{field.Invalid(p, image, "the image reference must carry a tag or a digest (e.g. registry/repo:tag or registry/repo@sha256:...)")}
	}
	return nil
}

// hasTagOrDigest says whether a reference names its tag or digest instead of defaulting to "latest".
func hasTagOrDigest(ref string) bool {
	if strings.Contains(ref, "@") {
		return true
	}
	lastComponent := ref[strings.LastIndex(ref, "/")+1:]
	return strings.Contains(lastComponent, ":")
}

var pullPolicies = []string{string(corev1.PullAlways), string(corev1.PullIfNotPresent), string(corev1.PullNever)}

func validatePullPolicy(p *field.Path, policy corev1.PullPolicy) field.ErrorList {
	if policy == "" || slices.Contains(pullPolicies, string(policy)) {
		return nil
	}
	return field.ErrorList{field.NotSupported(p, policy, pullPolicies)}
}

func validateModprobe(p *field.Path, mp *kmmv1beta1.ModprobeSpec) field.ErrorList {
	var errs field.ErrorList
	if mp.ModuleName == "" && mp.RawArgs == nil {
		errs = append(errs, field.Required(p.Child("moduleName"), "moduleName is required unless rawArgs is set"))
	}
	if mp.FirmwarePath != "" && path.Clean("/"+mp.FirmwarePath) == "/" {
		errs = append(errs, field.Invalid(p.Child("firmwarePath"), mp.FirmwarePath,
			"firmwarePath must be a directory below the image root, not /: the whole image would be copied to the host"))
	}
	if raw := mp.RawArgs; raw != nil && (len(raw.Load) == 0 || len(raw.Unload) == 0) {
		errs = append(errs, field.Required(p.Child("rawArgs"),
			"rawArgs needs both load and unload: without unload arguments the module could never be unloaded"))
	}
	errs = append(errs, validateRawArgs(p.Child("rawArgs"), mp)...)
	order := mp.ModulesLoadingOrder
	if len(order) > 0 && order[0] != mp.ModuleName {
		errs = append(errs, field.Invalid(p.Child("modulesLoadingOrder").Index(0), order[0], "the first entry of modulesLoadingOrder must equal moduleName"))
	}
	seen := make(map[string]bool, len(order))
	for i, mod := range order {
		if seen[mod] {
			errs = append(errs, field.Duplicate(p.Child("modulesLoadingOrder").Index(i), mod))
		}
		seen[mod] = true
	}
	return errs
}

// validateRawArgs refuses the rawArgs the worker would refuse whatever the kernel (RawArgs).
func validateRawArgs(p *field.Path, mp *kmmv1beta1.ModprobeSpec) field.ErrorList {
	raw := mp.RawArgs
	if raw == nil {
		return nil
	}
	var errs field.ErrorList
	for i, argv := range [][]string{raw.Load, raw.Unload} {
		if len(argv) == 0 {
			continue
		}
		if _, err := RawArgs(argv, mp.DirName, ""); err != nil {
			errs = append(errs, field.Invalid(p.Child([...]string{"load", "unload"}[i]), argv, rawArgsMessage(err)))
		}
	}
	return errs
}

func validateDevicePlugin(m *kmmv1beta1.Module, p *field.Path) field.ErrorList {
	dp := m.Spec.DevicePlugin
	if dp == nil {
		return nil
	}
	errs := validateImageReference(p.Child("container", "image"), dp.Container.Image, dp.Container.Image)
	for i, v := range dp.Volumes {
		if v.HostPath != nil && !kmmv1beta1.DevicePluginHostPathAllowed(v.HostPath.Path) {
			errs = append(errs, field.Invalid(p.Child("volumes").Index(i).Child("hostPath", "path"), v.HostPath.Path,
				"a device plugin may mount host paths only under /dev, /sys, /var, /opt or /run, without '..'"))
		}
	}
	if dp.InitContainer != nil {
		errs = append(errs, validateImageReference(p.Child("initContainer", "image"), dp.InitContainer.Image, dp.InitContainer.Image)...)
	}
	return errs
}

// validateDRA checks what the CRD schema checks of spec.dra: exclusive with devicePlugin, a driver
// name and DeviceClass names that are DNS subdomains (the class names unique), the host path rule.
func validateDRA(m *kmmv1beta1.Module, p *field.Path) field.ErrorList {
	d := m.Spec.DRA
	if d == nil {
		return nil
	}
	var errs field.ErrorList
	if m.Spec.DevicePlugin != nil {
		errs = append(errs, field.Forbidden(p, "spec.dra and spec.devicePlugin are mutually exclusive"))
	}
	errs = append(errs, validateImageReference(p.Child("container", "image"), d.Container.Image, d.Container.Image)...)
	if d.InitContainer != nil {
		errs = append(errs, validateImageReference(p.Child("initContainer", "image"), d.InitContainer.Image, d.InitContainer.Image)...)
	}
	if msgs := k8svalidation.IsDNS1123Subdomain(d.DriverName); len(msgs) > 0 || len(d.DriverName) > 63 {
		errs = append(errs, field.Invalid(p.Child("driverName"), d.DriverName, "must be a DNS subdomain of at most 63 characters"))
	}
	seen := map[string]bool{}
	for i, dc := range d.DeviceClasses {
		if msgs := k8svalidation.IsDNS1123Subdomain(dc.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("deviceClasses").Index(i).Child("name"), dc.Name, strings.Join(msgs, "; ")))
		}
		if seen[dc.Name] {
			errs = append(errs, field.Duplicate(p.Child("deviceClasses").Index(i).Child("name"), dc.Name))
		}
		seen[dc.Name] = true
	}
	for i, v := range d.Volumes {
		if v.HostPath != nil && !kmmv1beta1.DevicePluginHostPathAllowed(v.HostPath.Path) {
			errs = append(errs, field.Invalid(p.Child("volumes").Index(i).Child("hostPath", "path"), v.HostPath.Path,
				"a DRA driver may mount host paths only under /dev, /sys, /var, /opt or /run, without '..'"))
		}
	}
	return append(errs, validateServiceAccount(p.Child("serviceAccountName"), d.ServiceAccountName)...)
}

func validateUpgradePolicy(p *field.Path, up *kmmv1beta1.UpgradePolicy) field.ErrorList {
	if up == nil {
		return nil
	}
	var errs field.ErrorList
	if mu := up.MaxUnavailable; mu != nil {
		if err := validateIntOrPercent(mu.String(), "0 would never upgrade a node"); err != nil {
			errs = append(errs, field.Invalid(p.Child("maxUnavailable"), mu.String(), err.Error()))
		}
	}
	if mf := up.MaxFailed; mf != nil {
		if err := validateIntOrPercent(mf.String(), "0 would pause before any node failed; leave it out for no budget"); err != nil {
			errs = append(errs, field.Invalid(p.Child("maxFailed"), mf.String(), err.Error()))
		}
	}
	if up.Drain != nil {
		for i, pattern := range up.Drain.IgnoredNamespacePatterns {
			if _, err := kernel.CompilePattern(pattern); err != nil {
				errs = append(errs, field.Invalid(p.Child("drain", "ignoredNamespacePatterns").Index(i), pattern, "not a valid Go regular expression within kmm's bounds: "+err.Error()))
			}
		}
		errs = append(errs, validateDrainExtensions(p.Child("drain"), up.Drain)...)
	}
	return errs
}

// extendedResourceName is the schema's pattern of drain.deviceUsers.extendedResources[].
var extendedResourceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// validateDrainExtensions re-checks the schema's rules of drain.deviceUsers and drain.jobs.
func validateDrainExtensions(p *field.Path, d *kmmv1beta1.DrainSpec) field.ErrorList {
	var errs field.ErrorList
	if du := d.DeviceUsers; du != nil {
		if len(du.ExtendedResources) == 0 && !du.ResourceClaims {
			errs = append(errs, field.Required(p.Child("deviceUsers"), "deviceUsers must list extendedResources or set resourceClaims"))
		}
		if len(du.ExtendedResources) > 16 {
			errs = append(errs, field.TooMany(p.Child("deviceUsers", "extendedResources"), len(du.ExtendedResources), 16))
		}
		for i, name := range du.ExtendedResources {
			if len(name) > 317 || !extendedResourceName.MatchString(name) {
				errs = append(errs, field.Invalid(p.Child("deviceUsers", "extendedResources").Index(i), name, "should match '"+extendedResourceName.String()+"'"))
			}
		}
	}
	if j := d.Jobs; j != nil && (j.WaitSeconds < 1 || j.WaitSeconds > 86400) {
		errs = append(errs, field.Invalid(p.Child("jobs", "waitSeconds"), j.WaitSeconds, "should be from 1 to 86400 (a day)"))
	}
	return errs
}

// validateIntOrPercent accepts a positive integer or a percentage from 1% to 100%; whyNotZero says
// what 0 would mean.
func validateIntOrPercent(s, whyNotZero string) error {
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		n, err := strconv.Atoi(pct)
		if err != nil || n < 1 || n > 100 {
			return fmt.Errorf("must be a whole percentage from 1%% to 100%% (%s)", whyNotZero)
		}
		return nil
	}
	if n, err := strconv.Atoi(s); err != nil || n < 1 {
		return fmt.Errorf("must be a positive integer or a percentage such as 25%% (%s)", whyNotZero)
	}
	return nil
}
