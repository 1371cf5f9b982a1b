package worker

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// ArgvOptions is what the modprobe command lines need besides the ModuleConfig.
type ArgvOptions struct {
	// Root is the absolute directory passed to modprobe -d: the extracted image's dirName, which
	// holds lib/modules/<kernel>.
	Root string
	// ImageRoot is the extraction root, the image's "/": a rawArgs module file named by its path in
	// the image is found below it. "" means the parent directories of Root that dirName names.
	ImageRoot string
	// SoftdepFile is a modprobe.d-style file passed with -C, or "" for none.
	SoftdepFile string
	// DryRun adds -n (print, do not act) and -S <kernel> (use the config's kernel, not uname -r).
	DryRun bool
}

// dryRunPrefix is prepended to every command line in dry-run mode.
func dryRunPrefix(kernel string, dryRun bool) []string {
	if !dryRun {
		return nil
	}
	return []string{"-n", "-S", kernel}
}

// LoadArgs returns modprobe's arguments (without the program name) to load the module:
// `-v -d <root> [-C <softdep>] [args.load...] <moduleName> [parameters...]`, or, when rawArgs.load
// is set, `-v <its options> -d <root> -- <its modules and parameters>` after the checks of
// sanitizeRawArgs (an argv they refuse is an InvalidConfig error).
func LoadArgs(mc kmmv1beta1.ModuleConfig, o ArgvOptions) ([]string, error) {
	args := dryRunPrefix(mc.KernelVersion, o.DryRun)
	mp := mc.Modprobe
	if mp.RawArgs != nil && len(mp.RawArgs.Load) > 0 {
		raw, err := sanitizeRawArgs(mp.RawArgs.Load, rawContext(mc, o))
		if err != nil {
			return nil, &Error{Reason: contract.ReasonInvalidConfig, Err: err}
		}
		// -v first, as in a moduleName load, so that ShowDependsArgs finds it.
		return append(append(args, "-v"), raw...), nil
	}
	if mp.ModuleName == "" {
		return nil, errors.New("neither modprobe.moduleName nor modprobe.rawArgs.load is set: nothing to load")
	}
	args = append(args, "-v", "-d", o.Root)
	if o.SoftdepFile != "" {
		args = append(args, "-C", o.SoftdepFile)
	}
	if mp.Args != nil {
		args = append(args, mp.Args.Load...)
	}
	args = append(args, mp.ModuleName)
	return append(args, mp.Parameters...), nil
}

// UnloadArgs returns modprobe's arguments to unload the module: `-r -v -d <root> [args.unload...]`
// followed by the modulesLoadingOrder entries in order (or moduleName), or rawArgs.unload checked
// and rewritten as in LoadArgs.
func UnloadArgs(mc kmmv1beta1.ModuleConfig, o ArgvOptions) ([]string, error) {
	args := dryRunPrefix(mc.KernelVersion, o.DryRun)
	mp := mc.Modprobe
	if mp.RawArgs != nil && len(mp.RawArgs.Unload) > 0 {
		raw, err := sanitizeRawArgs(mp.RawArgs.Unload, rawContext(mc, o))
		if err != nil {
			return nil, &Error{Reason: contract.ReasonInvalidConfig, Err: err}
		}
		return append(args, raw...), nil
	}
	if mp.ModuleName == "" {
		return nil, errors.New("neither modprobe.moduleName nor modprobe.rawArgs.unload is set: nothing to unload")
	}
	args = append(args, "-r", "-v", "-d", o.Root)
	if mp.Args != nil {
		args = append(args, mp.Args.Unload...)
	}
	if len(mp.ModulesLoadingOrder) > 0 {
		return append(args, mp.ModulesLoadingOrder...), nil
	}
	return append(args, mp.ModuleName), nil
}

// rawContext is what sanitizeRawArgs checks the rawArgs of mc against.
func rawContext(mc kmmv1beta1.ModuleConfig, o ArgvOptions) rawArgsContext {
	dirName := modulesRoot(mc)
	root := o.ImageRoot
	if root == "" {
		root = o.Root
		for range strings.Split(dirName, "/") {
			if dirName != "." {
				root = filepath.Dir(root)
			}
		}
	}
	return rawArgsContext{dirName: "/" + dirName, kernel: mc.KernelVersion, root: root, moduleRoot: o.Root}
}

// ShowDependsArgs turns the arguments of a load built by LoadArgs (rawArgs included) into those that
// print what the load would insmod, without loading: "-v" becomes "--show-depends", so that the
// root, softdep file, args and module are the same.
func ShowDependsArgs(loadArgs []string) []string {
	out := append([]string(nil), loadArgs...)
	for i, a := range out {
		if a == "-v" {
			out[i] = "--show-depends"
			return out
		}
	}
	return nil
}

// insmodPaths returns the module files in modprobe --show-depends output ("insmod <path> [options]"
// lines; "builtin" and "install" lines name no file).
func insmodPaths(stdout string) []string {
	var paths []string
	for _, line := range strings.Split(stdout, "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "insmod" {
			paths = append(paths, fields[1])
		}
	}
	return paths
}

// InTreeRemoveArgs returns modprobe's arguments to remove an in-tree module: `-r -v <module>`,
// without -d, so that modprobe uses the node's own module tree.
func InTreeRemoveArgs(module, kernel string, dryRun bool) []string {
	return append(dryRunPrefix(kernel, dryRun), "-r", "-v", module)
}

// SoftdepConfig returns the modprobe.d lines that make each entry of order load after the next
// one ("softdep A pre: B"), or "" when order has fewer than two entries.
func SoftdepConfig(order []string) string {
	if len(order) < 2 {
		return ""
	}
	var b strings.Builder
	for i := 0; i+1 < len(order); i++ {
		fmt.Fprintf(&b, "softdep %s pre: %s\n", order[i], order[i+1])
	}
	return b.String()
}

// classifyModprobe turns modprobe's standard error into a failure class.
func classifyModprobe(stderr string) contract.Reason {
	s := strings.ToLower(stderr)
	switch {
	case strings.Contains(s, "in use"), strings.Contains(s, "resource busy"), strings.Contains(s, "resource temporarily unavailable"):
		return contract.ReasonBusy
	case strings.Contains(s, "not found"):
		return contract.ReasonNotFound
	default:
		return contract.ReasonOther
	}
}

// notLoaded reports whether a failed `modprobe -r` said the module is not loaded (or not known at
// all, which also means it is not loaded), which in-tree module removal ignores.
func notLoaded(stderr string) bool {
	s := strings.ToLower(stderr)
	return strings.Contains(s, "not found") || strings.Contains(s, "is not in kernel") || strings.Contains(s, "not currently loaded")
}
