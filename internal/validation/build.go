package validation

import (
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// defaultDirName is modprobe.dirName when it is not set (the CRD's default).
const defaultDirName = "/opt"

// validateBuildAndSign checks the build and sign recipes of the container and of each mapping
// (upstream's rules, and kmm's bounds on what the schema leaves open).
func validateBuildAndSign(m *kmmv1beta1.Module, container *field.Path, c *kmmv1beta1.ModuleLoaderContainerSpec) field.ErrorList {
	dirName := c.Modprobe.DirName
	if dirName == "" {
		dirName = defaultDirName
	}
	errs := validateBuild(container.Child("build"), c.Build)
	errs = append(errs, validateSign(m, container.Child("sign"), c.Sign, dirName)...)
	for i := range c.KernelMappings {
		p := container.Child("kernelMappings").Index(i)
		errs = append(errs, validateBuild(p.Child("build"), c.KernelMappings[i].Build)...)
		errs = append(errs, validateSign(m, p.Child("sign"), c.KernelMappings[i].Sign, dirName)...)
	}
	return errs
}

func validateBuild(p *field.Path, b *kmmv1beta1.Build) field.ErrorList {
	if b == nil {
		return nil
	}
	errs := validateObjectName(p.Child("dockerfileConfigMap"), b.DockerfileConfigMap)
	if len(b.BuildArgs) > kmmv1beta1.MaxBuildArgs {
		errs = append(errs, field.TooMany(p.Child("buildArgs"), len(b.BuildArgs), kmmv1beta1.MaxBuildArgs))
	}
	for i, a := range b.BuildArgs {
		if a.Name == "" {
			errs = append(errs, field.Required(p.Child("buildArgs").Index(i).Child("name"), "a build argument needs a name"))
		}
	}
	if len(b.Secrets) > kmmv1beta1.MaxBuildSecrets {
		errs = append(errs, field.TooMany(p.Child("secrets"), len(b.Secrets), kmmv1beta1.MaxBuildSecrets))
	}
	for i := range b.Secrets {
		errs = append(errs, validateObjectName(p.Child("secrets").Index(i), &b.Secrets[i])...)
	}
	if len(b.Selector) > kmmv1beta1.MaxBuildSelectorLabels {
		errs = append(errs, field.TooMany(p.Child("selector"), len(b.Selector), kmmv1beta1.MaxBuildSelectorLabels))
	}
	return append(errs, validateSelector(p.Child("selector"), b.Selector)...)
}

func validateSign(m *kmmv1beta1.Module, p *field.Path, s *kmmv1beta1.Sign, dirName string) field.ErrorList {
	if s == nil {
		return nil
	}
	errs := validateObjectName(p.Child("keySecret"), s.KeySecret)
	errs = append(errs, validateObjectName(p.Child("certSecret"), s.CertSecret)...)
	if s.UnsignedImage != "" {
		errs = append(errs, validateImage(m, p.Child("unsignedImage"), s.UnsignedImage)...)
	}
	return append(errs, validateFilesToSign(p.Child("filesToSign"), s.FilesToSign, dirName)...)
}

// validateFilesToSign applies upstream's rules (at least one entry, each under dirName) and the
// sign pod's (absolute, a glob path.Match compiles once the shell's [!…] is read as [^…]).
func validateFilesToSign(p *field.Path, files []string, dirName string) field.ErrorList {
	switch {
	case len(files) == 0:
		return field.ErrorList{field.Required(p, "filesToSign needs at least one path or glob of the modules to sign")}
	case len(files) > kmmv1beta1.MaxFilesToSign:
		return field.ErrorList{field.TooMany(p, len(files), kmmv1beta1.MaxFilesToSign)}
	}
	var errs field.ErrorList
	under := strings.TrimSuffix(path.Clean("/"+dirName), "/") + "/"
	for i, f := range files {
		switch {
		case !strings.HasPrefix(f, "/"):
			errs = append(errs, field.Invalid(p.Index(i), f, "must be an absolute path or glob"))
		case !strings.HasPrefix(path.Clean(f), under):
			errs = append(errs, field.Invalid(p.Index(i), f, fmt.Sprintf("must be under modprobe.dirName %s", under)))
		default:
			if _, err := path.Match(strings.ReplaceAll(f, "[!", "[^"), ""); err != nil {
				errs = append(errs, field.Invalid(p.Index(i), f, "not a valid glob: "+err.Error()))
			}
		}
	}
	return errs
}

// validateObjectName requires a reference to a ConfigMap or Secret of the Module's namespace with
// a valid name.
func validateObjectName(p *field.Path, ref *corev1.LocalObjectReference) field.ErrorList {
	if ref == nil || ref.Name == "" {
		return field.ErrorList{field.Required(p.Child("name"), "the name of an object in the Module's namespace is required")}
	}
	var errs field.ErrorList
	for _, msg := range apivalidation.IsDNS1123Subdomain(ref.Name) {
		errs = append(errs, field.Invalid(p.Child("name"), ref.Name, msg))
	}
	return errs
}
