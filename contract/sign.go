package contract

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// ActionSign is the sign pod's action (`worker sign`): pull the unsigned image, sign its modules,
// push the signed image.
const ActionSign Action = "sign"

// The sign pod's failure classes, beside ReasonImagePull, ReasonInvalidConfig and ReasonOther.
// Retrying with the same Secrets and image cannot succeed for SignKey and SignInput.
const (
	// ReasonSignKey: the key or certificate Secret is unusable (missing, malformed, encrypted, an
	// unsupported key type) or the key does not match the certificate.
	ReasonSignKey Reason = "SignKey"
	// ReasonSignInput: the image's files cannot be signed: a filesToSign entry matches nothing,
	// matches a file that is not a kernel module, a malformed signature, or a bound was exceeded.
	ReasonSignInput Reason = "SignInput"
	// ReasonImagePush: the signed image could not be pushed.
	ReasonImagePush Reason = "ImagePush"
)

// Where the sign pod finds the Secrets' keys (sign.keySecret's "key", sign.certSecret's "cert").
const (
	SignKeyFile  = "/run/kmm/sign/key/key"
	SignCertFile = "/run/kmm/sign/cert/cert"
)

// SignConfig is the sign pod's configuration file (JSON or YAML, unknown fields rejected), like
// Config for the worker pods: what to sign, resolved by the operator for one kernel.
type SignConfig struct {
	// Namespace and Name of the Module.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Kernel is the kernel version the images are for (reported back in the Result).
	Kernel string `json:"kernel"`
	// UnsignedImage is the image to sign (sign.unsignedImage, or the image a build pushed).
	UnsignedImage string `json:"unsignedImage"`
	// UnsignedImageRegistryTLS are sign.unsignedImageRegistryTLS.
	UnsignedImageRegistryTLS kmmv1beta1.TLSOptions `json:"unsignedImageRegistryTLS,omitempty"`
	// Image is the signed image to push (the kernel mapping's containerImage).
	Image string `json:"image"`
	// RegistryTLS are the kernel mapping's registryTLS, for the push.
	RegistryTLS kmmv1beta1.TLSOptions `json:"registryTLS,omitempty"`
	// FilesToSign are sign.filesToSign with the kernel variables substituted.
	FilesToSign []string `json:"filesToSign"`
}

// ReadSignConfig reads and validates a SignConfig file.
func ReadSignConfig(file string) (SignConfig, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return SignConfig{}, fmt.Errorf("reading the config file: %w", err)
	}
	var c SignConfig
	if len(strings.TrimSpace(string(data))) == 0 {
		return SignConfig{}, errors.New("the config is empty")
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return SignConfig{}, fmt.Errorf("config file %s: malformed config: %w", file, err)
	}
	return c, c.Validate()
}

// Validate reports the first missing field of c.
func (c SignConfig) Validate() error {
	switch {
	case c.Namespace == "" || c.Name == "":
		return errors.New("invalid sign config: namespace and name of the Module are required")
	case c.UnsignedImage == "" || c.Image == "":
		return errors.New("invalid sign config: unsignedImage and image are required")
	case c.UnsignedImage == c.Image:
		return fmt.Errorf("invalid sign config: the signed image %q would overwrite the unsigned one", c.Image)
	case len(c.FilesToSign) == 0:
		return errors.New("invalid sign config: filesToSign is empty")
	}
	return nil
}

// DefaultSignTimeout bounds a whole sign run (pull, signing, push); the sign pod's
// activeDeadlineSeconds goes above it.
const DefaultSignTimeout = 10 * time.Minute
