package worker

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// DefaultDirName is the directory of the kmod image that holds lib/modules when
// ModprobeSpec.DirName is empty (the API's default).
const DefaultDirName = "/opt"

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
	return c.Config.Validate()
}

// ModuleID is "<namespace>/<name>" of the Module.
func (c Config) ModuleID() string { return c.Namespace + "/" + c.Name }

// firmwareHostPath is FirmwareHostPath with its default, as a clean absolute path.
func (c Config) firmwareHostPath() string {
	if c.FirmwareHostPath == "" {
		return DefaultFirmwareHostPath
	}
	return path.Clean("/" + c.FirmwareHostPath)
}

// imageRel turns a directory of the kmod image (absolute or not) into a clean path relative to the
// image root. ".." cannot climb above the root, so the result never leaves it; "" is the root.
func imageRel(dir string) string {
	return strings.TrimPrefix(path.Clean("/"+dir), "/")
}

// modulesRoot is the extraction-root-relative directory modprobe -d points at (the image's dirName).
func modulesRoot(mc kmmv1beta1.ModuleConfig) string {
	if mc.Modprobe.DirName == "" {
		return imageRel(DefaultDirName)
	}
	return imageRel(mc.Modprobe.DirName)
}

// kernelDir is the extraction-root-relative <dirName>/lib/modules/<kernel>.
func kernelDir(mc kmmv1beta1.ModuleConfig) string {
	return path.Join(modulesRoot(mc), "lib/modules", mc.KernelVersion)
}

// firmwareDir is the extraction-root-relative firmware directory, "" when FirmwarePath is not set.
func firmwareDir(mc kmmv1beta1.ModuleConfig) string {
	if mc.Modprobe.FirmwarePath == "" {
		return ""
	}
	return imageRel(mc.Modprobe.FirmwarePath)
}
