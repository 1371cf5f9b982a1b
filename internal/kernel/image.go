package kernel

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// ImageVariables are the variables a kmod image reference may use, with what each stands for.
var ImageVariables = map[string]string{
	"KERNEL_FULL_VERSION": "the node's full kernel version, e.g. 5.14.0-553.el9.x86_64",
	"KERNEL_VERSION":      "the same as KERNEL_FULL_VERSION (kept for upstream compatibility)",
	"KERNEL_XYZ":          "the first three release components, e.g. 5.14.0",
	"KERNEL_X":            "the first release component, e.g. 5",
	"KERNEL_Y":            "the second release component, e.g. 14",
	"KERNEL_Z":            "the third release component, e.g. 0",
	"MOD_NAME":            "the Module's name",
	"MOD_NAMESPACE":       "the Module's namespace",
}

// ExpandImage substitutes $VAR and ${VAR} in image for kernel v and the Module's name and namespace.
// A variable that is not one of ImageVariables is an error.
func ExpandImage(image string, v Version, modName, modNamespace string) (string, error) {
	c := v.components(3)
	values := map[string]string{
		"KERNEL_FULL_VERSION": v.Full,
		"KERNEL_VERSION":      v.Full,
		"KERNEL_XYZ":          v.XYZ(),
		"KERNEL_X":            strconv.Itoa(c[0]),
		"KERNEL_Y":            strconv.Itoa(c[1]),
		"KERNEL_Z":            strconv.Itoa(c[2]),
		"MOD_NAME":            modName,
		"MOD_NAMESPACE":       modNamespace,
	}
	var unknown []string
	out := os.Expand(image, func(name string) string {
		val, ok := values[name]
		if !ok {
			unknown = append(unknown, "$"+name)
		}
		return val
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown variable %s; known variables are %s", strings.Join(unknown, ", "), knownVariables())
	}
	return out, nil
}

func knownVariables() string {
	names := make([]string, 0, len(ImageVariables))
	for n := range ImageVariables {
		names = append(names, "$"+n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
