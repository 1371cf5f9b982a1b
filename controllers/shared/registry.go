package shared

import (
	"context"
	"fmt"
	"path"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kmm-project/kmm/registry"
)

// RegistryOptions say which registry configuration kmm's pods pull and push with (docs/registries.md):
// worker pods, sign pods and build pods alike;
// the node's own files, mounted read-only at the same path, and cluster-wide ConfigMaps of the
// Module's namespace, mounted when they exist. Empty fields mount nothing.
type RegistryOptions struct {
	// ContainerdConfigPath is containerd's config_path on the nodes (/etc/containerd/certs.d).
	ContainerdConfigPath string
	// RegistriesConf is the nodes' registries.conf (/etc/containers/registries.conf).
	RegistriesConf string
	// CertsDirs are the nodes' certs.d directories (/etc/containers/certs.d, /etc/docker/certs.d).
	CertsDirs []string
	// CADirs are further node directories holding CA files that hosts.toml ca entries name.
	CADirs []string
	// RegistriesConfigMap names a ConfigMap (key registries.conf) in the Module's namespace that
	// is consulted before the node's files.
	RegistriesConfigMap string
	// CABundleConfigMap names a ConfigMap (key ca-bundle.crt) in the Module's namespace whose CA
	// certificates every worker trusts.
	CABundleConfigMap string
	// CredentialProviderConfig is the nodes' kubelet CredentialProviderConfig file, and
	// CredentialProviderBinDir the directory of the plugins it names.
	CredentialProviderConfig string
	CredentialProviderBinDir string
}

// Keys and mount paths of the ConfigMaps.
const (
	// RegistriesConfKey is the key of RegistryOptions.RegistriesConfigMap.
	RegistriesConfKey = "registries.conf"
	// CABundleKey is the key of RegistryOptions.CABundleConfigMap.
	CABundleKey         = "ca-bundle.crt"
	registriesConfigDir = "/etc/kmm/registries"
	caBundleDir         = "/etc/kmm/ca-bundle"
	// RegistryVolumePrefix starts the names of the registry settings' volumes.
	RegistryVolumePrefix = "registry-"
)

// Validate checks that the node paths are absolute.
func (o RegistryOptions) Validate() error {
	paths := append([]string{o.ContainerdConfigPath, o.RegistriesConf, o.CredentialProviderConfig, o.CredentialProviderBinDir}, o.CertsDirs...)
	for _, p := range append(paths, o.CADirs...) {
		if p != "" && (!path.IsAbs(p) || path.Clean(p) == "/") {
			return fmt.Errorf("worker registry host paths must be absolute and not /, got %q", p)
		}
	}
	if (o.CredentialProviderConfig == "") != (o.CredentialProviderBinDir == "") {
		return fmt.Errorf("the credential provider config and bin dir go together, got %q and %q", o.CredentialProviderConfig, o.CredentialProviderBinDir)
	}
	return nil
}

// hostMount is one read-only node path of the registry configuration.
type hostMount struct {
	path string
	kind corev1.HostPathType
}

func (o RegistryOptions) hostMounts() []hostMount {
	var m []hostMount
	add := func(p string, k corev1.HostPathType) {
		if p != "" {
			m = append(m, hostMount{path: path.Clean(p), kind: k})
		}
	}
	add(o.ContainerdConfigPath, corev1.HostPathDirectory)
	add(o.RegistriesConf, corev1.HostPathFile)
	for _, d := range append(append([]string(nil), o.CertsDirs...), o.CADirs...) {
		add(d, corev1.HostPathDirectory)
	}
	add(o.CredentialProviderConfig, corev1.HostPathFile)
	add(o.CredentialProviderBinDir, corev1.HostPathDirectory)
	return m
}

// RegistryPod is what a pod that pulls or pushes carries of the registry settings: the arguments
// (registry.Flags), the container's mounts and the pod's volumes.
type RegistryPod struct {
	Args    []string
	Mounts  []corev1.VolumeMount
	Volumes []corev1.Volume
}

// Pod is the registry settings of a pod whose service account has the pull secrets saSecrets (at
// most MaxServiceAccountPullSecrets, ServiceAccountPullSecrets reads them): worker pods, sign pods
// and build pods all take this, so that they pull and push alike.
func (o RegistryOptions) Pod(saSecrets []string) RegistryPod {
	args := o.args()
	if len(saSecrets) > 0 {
		args = append(args, flag(registry.FlagPullSecretDir), SAPullSecretDir)
	}
	return RegistryPod{Args: args, Mounts: o.mounts(saSecrets), Volumes: o.volumes(saSecrets)}
}

func flag(name string) string { return "--" + name }

// args are the registry flags of the files and ConfigMaps.
func (o RegistryOptions) args() []string {
	var a []string
	if o.ContainerdConfigPath != "" {
		a = append(a, flag(registry.FlagContainerdConfigPath), path.Clean(o.ContainerdConfigPath))
	}
	if o.RegistriesConf != "" {
		a = append(a, flag(registry.FlagRegistriesConf), path.Clean(o.RegistriesConf))
	}
	if o.RegistriesConfigMap != "" {
		a = append(a, flag(registry.FlagOperatorRegistriesConf), path.Join(registriesConfigDir, RegistriesConfKey))
	}
	if o.CABundleConfigMap != "" {
		a = append(a, flag(registry.FlagCABundle), path.Join(caBundleDir, CABundleKey))
	}
	for _, d := range o.CertsDirs {
		a = append(a, flag(registry.FlagCertsDir), path.Clean(d))
	}
	if o.CredentialProviderConfig != "" {
		a = append(a, flag(registry.FlagCredentialProviderConfig), path.Clean(o.CredentialProviderConfig),
			flag(registry.FlagCredentialProviderBinDir), path.Clean(o.CredentialProviderBinDir))
	}
	return a
}

// mounts are the container's mounts of the registry configuration and the service account's pull
// secrets, all read-only.
func (o RegistryOptions) mounts(saSecrets []string) []corev1.VolumeMount {
	var m []corev1.VolumeMount
	if len(saSecrets) > 0 {
		m = append(m, corev1.VolumeMount{Name: RegistryVolumePrefix + "sa-pull-secrets", MountPath: SAPullSecretDir, ReadOnly: true})
	}
	for i, h := range o.hostMounts() {
		m = append(m, corev1.VolumeMount{Name: fmt.Sprintf("%shost-%d", RegistryVolumePrefix, i), MountPath: h.path, ReadOnly: true})
	}
	if o.RegistriesConfigMap != "" {
		m = append(m, corev1.VolumeMount{Name: RegistryVolumePrefix + "conf", MountPath: registriesConfigDir, ReadOnly: true})
	}
	if o.CABundleConfigMap != "" {
		m = append(m, corev1.VolumeMount{Name: RegistryVolumePrefix + "ca-bundle", MountPath: caBundleDir, ReadOnly: true})
	}
	return m
}

// volumes are the pod's volumes of the registry configuration: the node paths as they are on the
// node (also in a dry-run sandbox: they are the node's runtime configuration), the ConfigMaps
// optional (a namespace without them pulls without them).
func (o RegistryOptions) volumes(saSecrets []string) []corev1.Volume {
	var v []corev1.Volume
	if len(saSecrets) > 0 {
		v = append(v, saPullSecretsVolume(saSecrets))
	}
	for i, h := range o.hostMounts() {
		v = append(v, corev1.Volume{Name: fmt.Sprintf("%shost-%d", RegistryVolumePrefix, i),
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: h.path, Type: ptr.To(h.kind)}}})
	}
	configMap := func(vol, cm, key string) corev1.Volume {
		return corev1.Volume{Name: RegistryVolumePrefix + vol, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: cm},
			Items:                []corev1.KeyToPath{{Key: key, Path: key}},
			Optional:             ptr.To(true),
		}}}
	}
	if o.RegistriesConfigMap != "" {
		v = append(v, configMap("conf", o.RegistriesConfigMap, RegistriesConfKey))
	}
	if o.CABundleConfigMap != "" {
		v = append(v, configMap("ca-bundle", o.CABundleConfigMap, CABundleKey))
	}
	return v
}

// MaxServiceAccountPullSecrets caps the service account's imagePullSecrets a worker pod mounts.
const MaxServiceAccountPullSecrets = 16

// SAPullSecretDir is where the service account's pull secrets are, one file per secret and key.
const SAPullSecretDir = "/var/run/kmm/sa-pull-secrets" //nolint:gosec // G101: a mount path, not a credential

// saPullSecretsVolume projects each secret's .dockerconfigjson and .dockercfg, optionally (a secret
// that is missing, or lacks the key, adds nothing), as <i>.dockerconfigjson and <i>.dockercfg.
func saPullSecretsVolume(names []string) corev1.Volume {
	var sources []corev1.VolumeProjection
	for i, n := range names {
		sources = append(sources, corev1.VolumeProjection{Secret: &corev1.SecretProjection{
			LocalObjectReference: corev1.LocalObjectReference{Name: n},
			Items: []corev1.KeyToPath{
				{Key: corev1.DockerConfigJsonKey, Path: fmt.Sprintf("%02d%s", i, corev1.DockerConfigJsonKey)},
				{Key: corev1.DockerConfigKey, Path: fmt.Sprintf("%02d%s", i, corev1.DockerConfigKey)},
			},
			Optional: ptr.To(true),
		}})
	}
	return corev1.Volume{Name: RegistryVolumePrefix + "sa-pull-secrets", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}}
}

// ServiceAccountPullSecrets reads the imagePullSecrets of the worker pod's service account
// ("default" when the Module names none). A service account that does not exist has none: the API
// server's ServiceAccount admission then refuses the worker pod itself, naming the missing account
// (the pair reports PodRejected). Any other failure, Forbidden included (an install whose RBAC lacks
// get on serviceaccounts), is returned: a worker pod without the secrets would fail its pull with
// a message that hides the cause, so none is made and the pair reports ServiceAccountUnreadable. At
// most MaxServiceAccountPullSecrets are returned.
func ServiceAccountPullSecrets(ctx context.Context, c client.Reader, namespace, name string) ([]string, error) {
	if c == nil {
		return nil, nil
	}
	if name == "" {
		name = "default"
	}
	var sa corev1.ServiceAccount
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &sa); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("cannot read service account %s/%s for its imagePullSecrets: %w", namespace, name, err)
	}
	var names []string
	for _, s := range sa.ImagePullSecrets {
		if s.Name != "" && len(names) < MaxServiceAccountPullSecrets {
			names = append(names, s.Name)
		}
	}
	return names, nil
}
