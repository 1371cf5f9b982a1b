package registry

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// dockerConfig is the content of a pull secret: a .dockerconfigjson ({"auths": {...}}) or a legacy
// .dockercfg (the map alone).
type dockerConfig struct {
	Auths map[string]authn.AuthConfig `json:"auths"`
}

// ReadKeychain reads a pull secret in docker-config form and returns a keychain that answers for
// the registries it names (anonymous for the others). An empty file name gives the anonymous keychain.
func ReadKeychain(file string) (authn.Keychain, error) {
	if file == "" {
		return StaticKeychain{}, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the pull secret: %w", err)
	}
	return ParseKeychain(data)
}

// Bounds of ReadKeychainDir.
const (
	// MaxPullSecrets caps the pull secret files read from a directory.
	MaxPullSecrets = 64
	// MaxPullSecretBytes caps one pull secret file.
	MaxPullSecretBytes = 1 << 20
)

// ReadKeychainDir reads every pull secret file of dir (.dockerconfigjson and .dockercfg alike; the
// projected volume's own ..data entries skipped) into one keychain, the first file in name order
// that names a registry answering for it. A missing directory gives the anonymous keychain.
func ReadKeychainDir(dir string) (authn.Keychain, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return nil, err
	}
	var chain []authn.Keychain
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || st.IsDir() || strings.HasPrefix(filepath.Base(f), "..") {
			continue // the projected volume's own ..data links and directories
		}
		if len(chain) == MaxPullSecrets {
			return nil, fmt.Errorf("more than %d pull secrets in %s", MaxPullSecrets, dir)
		}
		if st.Size() > MaxPullSecretBytes {
			return nil, fmt.Errorf("pull secret %s is larger than %d bytes", f, MaxPullSecretBytes)
		}
		kc, err := ReadKeychain(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		chain = append(chain, kc)
	}
	return authn.NewMultiKeychain(chain...), nil
}

// ParseKeychain parses a pull secret in docker-config form.
func ParseKeychain(data []byte) (authn.Keychain, error) {
	var cfg dockerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("malformed pull secret: %w", err)
	}
	if cfg.Auths == nil {
		if err := json.Unmarshal(data, &cfg.Auths); err != nil {
			return nil, fmt.Errorf("malformed pull secret: %w", err)
		}
	}
	kc := StaticKeychain{}
	for key, auth := range cfg.Auths {
		kc[DockerConfigHost(key)] = auth
	}
	return kc, nil
}

// StaticKeychain maps a registry host (as name.Registry.RegistryStr gives it) to credentials.
type StaticKeychain map[string]authn.AuthConfig

// Resolve implements authn.Keychain.
func (k StaticKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if auth, ok := k[DockerConfigHost(r.RegistryStr())]; ok {
		return authn.FromConfig(auth), nil
	}
	return authn.Anonymous, nil
}

// DockerConfigHost normalises a docker-config key ("https://host:5000/v1/", "host:5000") to host[:port].
func DockerConfigHost(key string) string {
	if strings.Contains(key, "://") {
		if u, err := url.Parse(key); err == nil {
			key = u.Host
		}
	}
	key, _, _ = strings.Cut(key, "/")
	switch key {
	case "docker.io", "registry-1.docker.io":
		return name.DefaultRegistry
	}
	return key
}
