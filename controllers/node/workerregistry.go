package node

import (
	"context"
	"fmt"
	"path"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WorkerRegistryOptions say which registry configuration worker pods pull with (docs/registries.md):
// the node's own files, mounted read-only at the same path, and cluster-wide ConfigMaps of the
// Module's namespace, mounted when they exist. Empty fields mount nothing.
type WorkerRegistryOptions struct {
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
	// RegistriesConfKey is the key of WorkerRegistryOptions.RegistriesConfigMap.
	RegistriesConfKey = "registries.conf"
	// CABundleKey is the key of WorkerRegistryOptions.CABundleConfigMap.
	CABundleKey          = "ca-bundle.crt"
	registriesConfigDir  = "/etc/kmm/registries"
	caBundleDir          = "/etc/kmm/ca-bundle"
	registryVolumePrefix = "registry-"
)

// Validate checks that the node paths are absolute.
func (o WorkerRegistryOptions) Validate() error {
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

func (o WorkerRegistryOptions) hostMounts() []hostMount {
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

// args are the worker's registry flags.
func (o WorkerRegistryOptions) args() []string {
	var a []string
	if o.ContainerdConfigPath != "" {
		a = append(a, "--containerd-config-path", path.Clean(o.ContainerdConfigPath))
	}
	if o.RegistriesConf != "" {
		a = append(a, "--registries-conf", path.Clean(o.RegistriesConf))
	}
	if o.RegistriesConfigMap != "" {
		a = append(a, "--operator-registries-conf", path.Join(registriesConfigDir, RegistriesConfKey))
	}
	if o.CABundleConfigMap != "" {
		a = append(a, "--ca-bundle", path.Join(caBundleDir, CABundleKey))
	}
	for _, d := range o.CertsDirs {
		a = append(a, "--certs-dir", path.Clean(d))
	}
	if o.CredentialProviderConfig != "" {
		a = append(a, "--credential-provider-config", path.Clean(o.CredentialProviderConfig),
			"--credential-provider-bin-dir", path.Clean(o.CredentialProviderBinDir))
	}
	return a
}

// mounts are the container's mounts of the registry configuration and the service account's pull
// secrets, all read-only.
func (o WorkerRegistryOptions) mounts(saSecrets []string) []corev1.VolumeMount {
	var m []corev1.VolumeMount
	if len(saSecrets) > 0 {
		m = append(m, corev1.VolumeMount{Name: registryVolumePrefix + "sa-pull-secrets", MountPath: saPullSecretDir, ReadOnly: true})
	}
	for i, h := range o.hostMounts() {
		m = append(m, corev1.VolumeMount{Name: fmt.Sprintf("%shost-%d", registryVolumePrefix, i), MountPath: h.path, ReadOnly: true})
	}
	if o.RegistriesConfigMap != "" {
		m = append(m, corev1.VolumeMount{Name: registryVolumePrefix + "conf", MountPath: registriesConfigDir, ReadOnly: true})
	}
	if o.CABundleConfigMap != "" {
		m = append(m, corev1.VolumeMount{Name: registryVolumePrefix + "ca-bundle", MountPath: caBundleDir, ReadOnly: true})
	}
	return m
}

// volumes are the pod's volumes of the registry configuration: the node paths as they are on the
// node (also in a dry-run sandbox: they are the node's runtime configuration), the ConfigMaps
// optional (a namespace without them pulls without them).
func (o WorkerRegistryOptions) volumes(saSecrets []string) []corev1.Volume {
	var v []corev1.Volume
	if len(saSecrets) > 0 {
		v = append(v, saPullSecretsVolume(saSecrets))
	}
	for i, h := range o.hostMounts() {
		v = append(v, corev1.Volume{Name: fmt.Sprintf("%shost-%d", registryVolumePrefix, i),
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: h.path, Type: ptr.To(h.kind)}}})
	}
	configMap := func(vol, cm, key string) corev1.Volume {
		return corev1.Volume{Name: registryVolumePrefix + vol, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
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

// saPullSecretDir is where the service account's pull secrets are, one file per secret and key.
const saPullSecretDir = "/var/run/kmm/sa-pull-secrets" //nolint:gosec // G101: a mount path, not a credential

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
	return corev1.Volume{Name: registryVolumePrefix + "sa-pull-secrets", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: sources}}}
}

// serviceAccountPullSecrets reads the imagePullSecrets of the worker pod's service account
// ("default" when the Module names none). A service account that does not exist has none: the API
// server's ServiceAccount admission then refuses the worker pod itself, naming the missing account
// (the pair reports PodRejected). Any other failure, Forbidden included (an install whose RBAC lacks
// get on serviceaccounts), is returned: a worker pod without the secrets would fail its pull with
// a message that hides the cause, so none is made and the pair reports ServiceAccountUnreadable. At
// most MaxServiceAccountPullSecrets are returned.
func serviceAccountPullSecrets(ctx context.Context, c client.Reader, namespace, name string) ([]string, error) {
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

// SAPullSecretsTTL is how long the NMC controller reuses a service account's imagePullSecrets
// for the worker pods it creates: a secret added to (or removed from) the service account reaches
// the worker pods created at most this long after the change. Without it every worker pod create
// read the service account once more (issue 22: a GET per pair, 1,000 in a 1,000-node load).
const SAPullSecretsTTL = 30 * time.Second

// saPullSecretsCacheSize bounds the service accounts remembered at once (the least recently used
// go first); a load touches one per Module.
const saPullSecretsCacheSize = 256

// saPullSecretsCache remembers serviceAccountPullSecrets' answers for SAPullSecretsTTL. Errors are
// not remembered, and concurrent misses for one service account share one read.
type saPullSecretsCache struct {
	once  sync.Once
	lru   *cache.LRUExpireCache
	reads singleflight.Group
}

// get is serviceAccountPullSecrets(ctx, c, namespace, name), from memory when read less than
// SAPullSecretsTTL ago by this process. clk is the reconciler's clock (nil: the real one), read on
// first use.
func (s *saPullSecretsCache) get(ctx context.Context, c client.Reader, clk clock.PassiveClock, namespace, name string) ([]string, error) {
	if c == nil {
		return nil, nil
	}
	s.once.Do(func() {
		if clk == nil {
			clk = clock.RealClock{}
		}
		s.lru = cache.NewLRUExpireCacheWithClock(saPullSecretsCacheSize, clk)
	})
	if name == "" {
		name = "default"
	}
	key := namespace + "/" + name
	if v, ok := s.lru.Get(key); ok {
		return v.([]string), nil
	}
	v, err, _ := s.reads.Do(key, func() (any, error) {
		names, err := serviceAccountPullSecrets(ctx, c, namespace, name)
		if err == nil {
			s.lru.Add(key, names, SAPullSecretsTTL)
		}
		return names, err
	})
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}
