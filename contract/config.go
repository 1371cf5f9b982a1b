package contract

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/validation"
)

// DefaultDirName is the directory of the kmod image that holds lib/modules when
// ModprobeSpec.DirName is empty (the API's default).
const DefaultDirName = "/opt"

// HostModulesDir is where a worker pod sees the node's /lib/modules a second time (read-only),
// as upstream KMM's worker does: a kmod image may link <dirName>/lib/modules/<kernel>/host to
// HostModulesDir/<kernel> so that modprobe resolves in-tree dependencies (docs/api.md).
const HostModulesDir = "/host/lib/modules"

// DefaultFirmwareHostPath is where firmware is installed on the host when Config.FirmwareHostPath is empty.
const DefaultFirmwareHostPath = "/var/lib/firmware"

// Config is the worker's configuration file. The operator writes it as JSON into a pod annotation
// that the downward API mounts as a file; YAML is accepted too. Unknown fields are rejected.
type Config struct {
	// Namespace of the Module.
	Namespace string `json:"namespace"`
	// Name of the Module.
	Name string `json:"name"`
	// Config is what to load or unload, as resolved for this node.
	Config kmmv1beta1.ModuleConfig `json:"config"`
	// Previous is, for a reload only, the loaded config to unload before Config is loaded (same
	// Module, same kernel).
	Previous *kmmv1beta1.ModuleConfig `json:"previous,omitempty"`
	// SetFirmwareClassPath, when true and Config.Modprobe.FirmwarePath is set, makes a load write
	// FirmwareHostPath to /sys/module/firmware_class/parameters/path.
	SetFirmwareClassPath bool `json:"setFirmwareClassPath,omitempty"`
	// FirmwareHostPath is the host directory firmware is copied to (default /var/lib/firmware).
	FirmwareHostPath string `json:"firmwareHostPath,omitempty"`
}

// ReadConfig reads and validates a Config file.
func ReadConfig(file string) (Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Config{}, fmt.Errorf("reading the config file: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config file %s: %w", file, err)
	}
	return cfg, nil
}

// ParseConfig decodes a Config from JSON or YAML, rejecting unknown fields, and validates it.
func ParseConfig(data []byte) (Config, error) {
	var cfg Config
	if len(strings.TrimSpace(string(data))) == 0 {
		return Config{}, errors.New("the config is empty")
	}
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return Config{}, fmt.Errorf("malformed config: %w", err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate reports the first missing or inconsistent field of c.
func (c Config) Validate() error {
	if c.Namespace == "" || c.Name == "" {
		return errors.New("invalid config: namespace and name of the Module are required")
	}
	// The operator checks the same before it creates a worker pod: one function for both sides.
	if err := validation.ModuleConfig(&c.Config); err != nil {
		return err
	}
	if c.Previous == nil {
		return nil
	}
	if c.Previous.KernelVersion != c.Config.KernelVersion {
		return fmt.Errorf("invalid config: the previous config is for kernel %q, the config for %q", c.Previous.KernelVersion, c.Config.KernelVersion)
	}
	if err := validation.ModuleConfig(c.Previous); err != nil {
		return fmt.Errorf("previous config: %w", err)
	}
	return nil
}

// ValidateFor checks c for a run of action: a reload needs a previous config, the others take none.
func (c Config) ValidateFor(action Action) error {
	if (action == ActionReload) != (c.Previous != nil) {
		return fmt.Errorf("invalid config: a previous config goes with the action reload only (action %s, previous given: %v)", action, c.Previous != nil)
	}
	return c.Validate()
}

// ModuleID is "<namespace>/<name>" of the Module.
func (c Config) ModuleID() string { return c.Namespace + "/" + c.Name }
