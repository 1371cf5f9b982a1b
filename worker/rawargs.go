package worker

import (
	"path"
	"path/filepath"
	"strings"

	"github.com/kmm-project/kmm/internal/validation"
)

// rawArgsContext is what a rawArgs argv is checked against.
type rawArgsContext struct {
	// dirName is the Module's modprobe.dirName as the image has it ("/opt").
	dirName string
	// kernel is the kernel version the worker loads for.
	kernel string
	// root is the extraction root (the image's "/"); moduleRoot is root joined with dirName.
	root, moduleRoot string
}

// sanitizeRawArgs checks a rawArgs argv (validation.RawArgs) and returns the argv to run: its
// options without -d and -S, then -d <the extracted dirName>, then "--" and its operands, a module
// file given by its path in the image ("/opt/lib/modules/<kernel>/extra/m.ko") rewritten to the
// extracted file. The load is then checked with --show-depends as a moduleName load is.
func sanitizeRawArgs(argv []string, c rawArgsContext) ([]string, error) {
	p, err := validation.RawArgs(argv, c.dirName, c.kernel)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, o := range p.Options {
		switch o.Opt.Long {
		case "dirname", "set-version":
			continue // the worker passes -d, and -S in dry-run mode
		case "wait":
			out = append(out, "--wait="+o.Value)
		default:
			out = append(out, "--"+o.Opt.Long)
		}
	}
	out = append(out, "-d", c.moduleRoot, "--")
	for _, a := range p.Operands {
		if strings.HasPrefix(a, "/") {
			a = filepath.Join(c.root, filepath.FromSlash(strings.TrimPrefix(path.Clean(a), "/")))
		}
		out = append(out, a)
	}
	return out, nil
}
