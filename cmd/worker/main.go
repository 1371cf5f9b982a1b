// Command worker is kmm's worker: run once in a pod on a node, it pulls a kmod image, loads or
// unloads one kernel module and writes a JSON result to the termination-message path. Its sign
// subcommand (sign.go) runs in the sign pod instead: it signs the modules of an image.
//
//	worker load|unload --config <file> [--pull-secret <docker-config>] [--cache-dir <dir>]
//	       [--host-root <dir>] [--termination-log <file>] [--dry-run] [--modprobe <path>]
//	       [--timeout <duration>] [--max-extract-bytes <n>] [--max-image-bytes <n>]
//	       [--max-tar-bytes <n>] [--cache-budget-bytes <n>] [--cache-max-age <duration>]
//	       [--containerd-config-path <dir>] [--registries-conf <file>]... [--operator-registries-conf <file>]...
//	       [--ca-bundle <file>]... [--certs-dir <dir>]...
//	       [--log-level <level>] [--log-console]
//
// The registry flags name the configuration the node's container runtime pulls with (containerd's
// config_path, CRI-O's registries.conf, certs.d directories) and the operator's own
// (registries.conf, CA bundle); docs/registries.md says how the worker chooses where to pull from.
//
// --timeout (default 4m, contract.DefaultTimeout) bounds the whole run: pull, extraction, firmware
// and modprobe. A run that reaches it still writes a Result: ImagePull ("timed out after …") when
// it was pulling or extracting, Other when it was loading or unloading. The operator gives the pod
// an activeDeadlineSeconds above it. docs/worker-limits.md lists every limit.
//
// Exit status: 0 the action succeeded; 1 it failed (the result says why); 2 usage error (no
// result written); 3 the result could not be written.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/internal/logging"
	"github.com/kmm-project/kmm/registry"
	"github.com/kmm-project/kmm/worker"
)

// Exit statuses.
const (
	exitSucceeded   = 0
	exitFailed      = 1
	exitUsage       = 2
	exitResultWrite = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// flags are the command-line settings.
type flags struct {
	action         contract.Action
	config         string
	pullSecret     string
	cacheDir       string
	hostRoot       string
	hostModules    string
	terminationLog string
	modprobe       string
	maxBytes       int64
	maxImageBytes  int64
	maxTarBytes    int64
	timeout        time.Duration
	cacheBudget    int64
	cacheMaxAge    time.Duration
	dryRun         bool
	logLevel       string
	logConsole     bool
	// registry are the registry settings (mirrors, CAs, the service account's pull secrets,
	// credential providers), the flags every pod that pulls or pushes takes.
	registry registry.Flags
}

// parseFlags reads `load|unload [flags]` (the action may also follow the flags).
func parseFlags(args []string, errOut io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(errOut, "usage: worker load|unload --config <file> [flags]")
		fs.PrintDefaults()
	}
	fs.StringVar(&f.config, "config", "", "Worker config file (JSON or YAML), usually the downward-API file of the pod annotation. Required.")
	fs.StringVar(&f.pullSecret, "pull-secret", "", "Pull secret in docker-config form (.dockerconfigjson); empty for anonymous pulls.")
	fs.StringVar(&f.cacheDir, "cache-dir", "/var/lib/kmm/cache", "Digest-keyed image cache; a host path so that it survives the pod.")
	fs.StringVar(&f.hostRoot, "host-root", "/", "Where the host's / is: boot ID, firmware directory and sysfs are read and written below it.")
	fs.StringVar(&f.hostModules, "host-modules-dir", contract.HostModulesDir, "Where the node's /lib/modules is mounted read-only: a kmod image's <dirName>/lib/modules/<kernel>/host may link to "+contract.HostModulesDir+"/<kernel> to resolve in-tree dependencies there; empty refuses that link.")
	fs.StringVar(&f.terminationLog, "termination-log", "/dev/termination-log", "File the JSON result is written to.")
	fs.StringVar(&f.modprobe, "modprobe", "/usr/sbin/modprobe", "The modprobe binary.")
	fs.Int64Var(&f.maxBytes, "max-extract-bytes", worker.DefaultMaxExtractBytes, "Cap on the file bytes extracted from the image.")
	fs.Int64Var(&f.maxImageBytes, "max-image-bytes", worker.DefaultMaxImageBytes, "Cap on the compressed bytes of the image's layers.")
	fs.Int64Var(&f.maxTarBytes, "max-tar-bytes", worker.DefaultMaxTarBytes, "Cap on the uncompressed archive bytes read from the image's layers, skipped entries included.")
	fs.Int64Var(&f.cacheBudget, "cache-budget-bytes", worker.DefaultCacheBudget, "Size the cache is brought back under (least recently used first) after a new entry is filled.")
	fs.DurationVar(&f.cacheMaxAge, "cache-max-age", worker.DefaultCacheMaxAge, "Cache entries no tag record names are removed after this long unused.")
	fs.DurationVar(&f.timeout, "timeout", contract.DefaultTimeout, "Deadline of the whole run (pull, extraction, firmware, modprobe); a run that reaches it reports a timed-out result.")
	fs.BoolVar(&f.dryRun, "dry-run", false, "Run modprobe -n -S <kernel> and treat --host-root as a sandbox directory (which must not be /).")
	registryFlags(fs, &f)
	fs.StringVar(&f.logLevel, "log-level", "info", "Log level: debug, info, warn or error.")
	fs.BoolVar(&f.logConsole, "log-console", false, "Log human-readable text instead of JSON.")

	var action string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		action, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if action == "" && fs.NArg() > 0 {
		action = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	f.action = contract.Action(action)
	return f, f.check()
}

// registryFlags are the registry configuration and credential flags, the same for every action.
func registryFlags(fs *flag.FlagSet, f *flags) {
	f.registry.Bind(fs)
}

func (f flags) check() error {
	switch {
	case f.action != contract.ActionLoad && f.action != contract.ActionUnload && f.action != contract.ActionReload:
		return fmt.Errorf("the action must be load, unload or reload, got %q", f.action)
	case f.config == "":
		return errors.New("--config is required")
	case f.timeout <= 0:
		return fmt.Errorf("--timeout must be positive, got %s", f.timeout)
	case f.registry.Check() != nil:
		return f.registry.Check()
	case f.dryRun && filepath.Clean(f.hostRoot) == "/":
		return errors.New("--dry-run needs --host-root pointing at a sandbox directory, not /")
	}
	return nil
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == string(contract.ActionSign) {
		return runSign(ctx, args[1:], stdout, stderr)
	}
	f, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprintln(stderr, "worker:", err)
		}
		return exitUsage
	}
	log, err := logging.New(stderr, f.logLevel, f.logConsole)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "worker:", err)
		return exitUsage
	}
	return report(execute(ctx, f, log), f.terminationLog, "worker", stdout, stderr)
}

// report writes res as the termination message (and to stdout) and returns the exit code: failed
// unless res succeeded, or a write failure.
func report(res contract.Result, terminationLog, who string, stdout, stderr io.Writer) int {
	data, err := res.Marshal()
	if err == nil {
		err = os.WriteFile(terminationLog, data, 0o644) // #nosec G306 -- the kubelet reads it; it holds no secret
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, who+": writing the result:", err)
		return exitResultWrite
	}
	_, _ = fmt.Fprintln(stdout, string(data))
	if res.Outcome != contract.OutcomeSucceeded {
		return exitFailed
	}
	return exitSucceeded
}

// execute reads the config and pull secret, builds the worker and runs the action.
func execute(ctx context.Context, f flags, log logr.Logger) contract.Result {
	cfg, err := contract.ReadConfig(f.config)
	if err != nil {
		return worker.Failure(f.action, contract.Config{}, &worker.Error{Reason: contract.ReasonInvalidConfig, Err: err})
	}
	kc, err := keychain(f)
	if err != nil {
		return worker.Failure(f.action, cfg, &worker.Error{Reason: contract.ReasonImagePull, Err: err})
	}
	host := worker.NewNodeHost(f.hostRoot)
	if f.dryRun {
		host = worker.NewSandboxHost(f.hostRoot)
	}
	w, err := worker.New(worker.Options{
		CacheDir:        f.cacheDir,
		Keychain:        kc,
		Registries:      f.registry.Sources,
		Trust:           f.registry.Trust,
		MaxExtractBytes: f.maxBytes,
		Limits:          worker.Limits{MaxImageBytes: f.maxImageBytes, MaxTarBytes: f.maxTarBytes},
		Timeout:         f.timeout,
		CacheBudget:     f.cacheBudget,
		CacheMaxAge:     f.cacheMaxAge,
		DryRun:          f.dryRun,
		Modprobe:        worker.ExecModprobe{Path: f.modprobe},
		Host:            host,
		HostModulesDir:  f.hostModules,
		Log:             log,
	})
	if err != nil {
		return worker.Failure(f.action, cfg, err)
	}
	return w.Run(ctx, f.action, cfg)
}

// keychain combines the credential sources in the order they are consulted: the Module's pull
// secret, the service account's pull secrets, the node's credential provider plugins.
func keychain(f flags) (authn.Keychain, error) {
	return f.registry.Keychain(f.pullSecret)
}
