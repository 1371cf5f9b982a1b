package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
)

// MaxConfigBytes caps a hosts.toml or registries.conf file.
const MaxConfigBytes = 256 << 10

// Sources name the configuration files to read; every field is optional, and a missing file or
// directory counts as no configuration (nodes differ).
type Sources struct {
	// OperatorRegistriesConf are registries.conf files the operator gives every worker.
	OperatorRegistriesConf []string
	// ContainerdConfigPath is containerd's config_path (e.g. /etc/containerd/certs.d).
	ContainerdConfigPath string
	// NodeRegistriesConf are the node's registries.conf files (e.g. /etc/containers/registries.conf).
	NodeRegistriesConf []string
}

// Load reads the configuration that applies to images of the registry reg (as
// name.Registry.RegistryStr gives it).
func Load(src Sources, reg string) (Settings, error) {
	var s Settings
	var err error
	if s.Operator, err = readRegistriesConfs(src.OperatorRegistriesConf); err != nil {
		return Settings{}, err
	}
	if s.Node, err = readRegistriesConfs(src.NodeRegistriesConf); err != nil {
		return Settings{}, err
	}
	if src.ContainerdConfigPath == "" {
		return s, nil
	}
	for _, dir := range hostDirs(reg) {
		file := filepath.Join(src.ContainerdConfigPath, dir, "hosts.toml")
		data, err := readBounded(file, MaxConfigBytes)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return Settings{}, err
		}
		hf, err := ParseHostsTOML(file, data)
		if err != nil {
			return Settings{}, err
		}
		s.Containerd = &hf
		break
	}
	return s, nil
}

// hostDirs are the config_path directories containerd looks in for reg, in order.
func hostDirs(reg string) []string {
	return []string{canonicalHost(reg), "_default"}
}

func readRegistriesConfs(files []string) ([]RegistriesConf, error) {
	var out []RegistriesConf
	for _, f := range files {
		data, err := readBounded(f, MaxConfigBytes)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		c, err := ParseRegistriesConf(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// PlanFor loads the configuration for ref's registry and plans its endpoints.
func PlanFor(src Sources, ref name.Reference, module ModuleTLS) ([]Endpoint, error) {
	s, err := Load(src, ref.Context().RegistryStr())
	if err != nil {
		return nil, fmt.Errorf("reading the registry configuration: %w", err)
	}
	return Plan(ref, s, module)
}
