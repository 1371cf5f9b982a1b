package validation

import (
	"errors"
	"fmt"
	"path"
	"strings"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel"
)

// ModuleConfig reports what makes c a config the worker cannot act on. The operator checks it before
// creating a worker pod (a config that fails here never reaches a node), and the worker checks it
// again on the node; both use this one function.
func ModuleConfig(c *kmmv1beta1.ModuleConfig) error {
	var problems []string
	switch err := kernel.CheckString(c.KernelVersion); {
	case c.KernelVersion == "":
		problems = append(problems, "config.kernelVersion is required")
	case err != nil:
		problems = append(problems, fmt.Sprintf("config.kernelVersion %.80q is not a kernel version: %v", c.KernelVersion, err))
	}
	if c.ContainerImage == "" {
		problems = append(problems, "config.containerImage is required")
	}
	mp := &c.Modprobe
	if mp.ModuleName == "" && mp.RawArgs == nil {
		problems = append(problems, "config.modprobe.moduleName is required unless rawArgs is set")
	}
	if mp.FirmwarePath != "" && path.Clean("/"+mp.FirmwarePath) == "/" {
		problems = append(problems, "config.modprobe.firmwarePath must be a directory below the image root, not /")
	}
	if raw := mp.RawArgs; raw != nil {
		for i, argv := range [][]string{raw.Load, raw.Unload} {
			if len(argv) == 0 {
				continue
			}
			if _, err := RawArgs(argv, mp.DirName, c.KernelVersion); err != nil {
				problems = append(problems, fmt.Sprintf("config.modprobe.rawArgs.%s: %s", [...]string{"load", "unload"}[i], rawArgsMessage(err)))
			}
		}
	}
	if o := mp.ModulesLoadingOrder; len(o) > 0 && o[0] != mp.ModuleName {
		problems = append(problems, "the first entry of config.modprobe.modulesLoadingOrder must equal moduleName")
	}
	if len(problems) > 0 {
		return errors.New("invalid config: " + strings.Join(problems, "; "))
	}
	return nil
}
