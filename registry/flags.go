package registry

import (
	"errors"
	"flag"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
)

// The command-line flags of the registry settings (without their leading "--"). The worker (load,
// unload, `worker sign`) and the builder take the same ones; the operator passes them to every pod
// that pulls or pushes (controllers/shared.RegistryOptions), so that the settings are defined once.
const (
	FlagContainerdConfigPath     = "containerd-config-path"
	FlagRegistriesConf           = "registries-conf"
	FlagOperatorRegistriesConf   = "operator-registries-conf"
	FlagCABundle                 = "ca-bundle"
	FlagCertsDir                 = "certs-dir"
	FlagPullSecretDir            = "pull-secret-dir"
	FlagCredentialProviderConfig = "credential-provider-config"  //nolint:gosec // G101: a flag name, not a credential
	FlagCredentialProviderBinDir = "credential-provider-bin-dir" //nolint:gosec // G101: a flag name, not a credential
)

// Flags are the registry settings of one pod, as its command line gives them: where the mirrors,
// TLS settings and CAs are read from, and where further credentials come from.
type Flags struct {
	// Sources are the registries.conf and hosts.toml files.
	Sources Sources
	// Trust are the CA bundles and certs.d directories.
	Trust Trust
	// PullSecretDir holds the service account's pull secrets (consulted after the Module's).
	PullSecretDir string
	// ProviderConfig and ProviderBinDir are the kubelet's credential providers (together or not at all).
	ProviderConfig, ProviderBinDir string
}

// Bind registers the flags on fs.
func (f *Flags) Bind(fs *flag.FlagSet) {
	fs.StringVar(&f.Sources.ContainerdConfigPath, FlagContainerdConfigPath, "", "containerd's config_path (<dir>/<registry>/hosts.toml): mirrors, CAs and TLS settings of the node's registries.")
	fs.Var(listFlag{&f.Sources.NodeRegistriesConf}, FlagRegistriesConf, "The node's registries.conf (v2: mirrors, blocked and insecure registries); repeatable. A missing file is skipped.")
	fs.Var(listFlag{&f.Sources.OperatorRegistriesConf}, FlagOperatorRegistriesConf, "registries.conf from the operator, consulted before the node's files; repeatable. A missing file is skipped.")
	fs.Var(listFlag{&f.Trust.BundleFiles}, FlagCABundle, "PEM file of CA certificates trusted for every registry beside the system's; repeatable. A missing file is skipped.")
	fs.Var(listFlag{&f.Trust.CertsDirs}, FlagCertsDir, "certs.d directory (<dir>/<host[:port]>/*.crt trusted for that host); repeatable.")
	fs.StringVar(&f.PullSecretDir, FlagPullSecretDir, "", "Directory of further pull secrets in docker-config form (the service account's imagePullSecrets), one per subdirectory or file; consulted after --pull-secret.")
	fs.StringVar(&f.ProviderConfig, FlagCredentialProviderConfig, "", "The node's kubelet CredentialProviderConfig: its plugins (credentialprovider.kubelet.k8s.io/v1) give credentials for the images they match, after the pull secrets.")
	fs.StringVar(&f.ProviderBinDir, FlagCredentialProviderBinDir, "", "Directory of the credential provider plugins (the kubelet's --image-credential-provider-bin-dir).")
}

// Check refuses a credential provider config without its bin dir and the other way round.
func (f Flags) Check() error {
	if (f.ProviderConfig == "") != (f.ProviderBinDir == "") {
		return errors.New("--" + FlagCredentialProviderConfig + " and --" + FlagCredentialProviderBinDir + " go together")
	}
	return nil
}

// Keychain is the credentials of a pull or push, in order: the pull secret file (the Module's
// imageRepoSecret; "" for none), the service account's pull secrets, the credential providers.
func (f Flags) Keychain(pullSecret string) (authn.Keychain, error) {
	secret, err := ReadKeychain(pullSecret)
	if err != nil {
		return nil, err
	}
	chain := []authn.Keychain{secret}
	if f.PullSecretDir != "" {
		sa, err := ReadKeychainDir(f.PullSecretDir)
		if err != nil {
			return nil, err
		}
		chain = append(chain, sa)
	}
	if f.ProviderConfig != "" {
		p, err := LoadCredentialProviders(f.ProviderConfig, f.ProviderBinDir)
		if err != nil {
			return nil, err
		}
		chain = append(chain, p)
	}
	return authn.NewMultiKeychain(chain...), nil
}

// listFlag is a flag that may be given several times (or once with commas).
type listFlag struct{ list *[]string }

func (l listFlag) String() string {
	if l.list == nil {
		return ""
	}
	return strings.Join(*l.list, ",")
}

func (l listFlag) Set(v string) error {
	for _, e := range strings.Split(v, ",") {
		if e != "" {
			*l.list = append(*l.list, e)
		}
	}
	return nil
}
