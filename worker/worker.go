package worker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/registry"
)

// Options configure a Worker.
type Options struct {
	// CacheDir is the digest-keyed image cache (a host path in production). Required.
	CacheDir string
	// Keychain gives registry credentials; nil means anonymous (see ReadKeychain).
	Keychain authn.Keychain
	// Transport is the base HTTP transport to registries; nil means go-containerregistry's default
	// with the timeouts of registryTransport.
	Transport http.RoundTripper
	// Registries name the registry configuration files (mirrors, blocked registries) to honour.
	Registries registry.Sources
	// Trust names the CA bundles and certs.d directories trusted beside the system's roots.
	Trust registry.Trust
	// MaxExtractBytes caps the file bytes extracted from one image; 0 means DefaultMaxExtractBytes.
	MaxExtractBytes int64
	// Limits bound the rest of the work on one image; zero fields mean their defaults.
	Limits Limits
	// Timeout bounds a whole Run (pull, extraction, firmware, modprobe); 0 means contract.DefaultTimeout.
	Timeout time.Duration
	// CacheBudget is the cache size that eviction restores after a new entry is filled; 0 means
	// DefaultCacheBudget.
	CacheBudget int64
	// CacheMaxAge is how long an entry that no tag record names stays unused; 0 means DefaultCacheMaxAge.
	CacheMaxAge time.Duration
	// DryRun runs modprobe with -n and -S <kernel>: it resolves modules and prints what it would
	// do without loading anything. Use it with a sandbox Host.
	DryRun bool
	// Modprobe runs modprobe. Required.
	Modprobe Modprobe
	// Host is the node's filesystem. Required.
	Host Host
	// HostModulesDir is where the node's /lib/modules is seen (contract.HostModulesDir in a worker
	// pod). When set, the image's <dirName>/lib/modules/<kernel>/host may link to
	// contract.HostModulesDir/<kernel>: it is extracted as a link to HostModulesDir/<kernel>, and
	// modprobe may load in-tree modules from there. "" refuses that link.
	HostModulesDir string
	// TempDir holds short-lived files such as the softdep config; "" means os.TempDir().
	TempDir string
	// Log receives one line per step; the zero value discards.
	Log logr.Logger
}

// Worker loads and unloads one module per Run.
type Worker struct {
	opts Options
}

// New checks opts and returns a Worker.
func New(opts Options) (*Worker, error) {
	switch {
	case opts.CacheDir == "":
		return nil, errors.New("a cache directory is required")
	case opts.Modprobe == nil:
		return nil, errors.New("a modprobe runner is required")
	case opts.Host == nil:
		return nil, errors.New("a host is required")
	}
	// modprobe gets paths below the cache as -d and -C, and prints the module files it would load
	// from them; the path check compares those with the module directory, so both must be absolute
	// whatever directory the worker runs in.
	for _, p := range []*string{&opts.CacheDir, &opts.TempDir, &opts.HostModulesDir} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("making %q absolute: %w", *p, err)
		}
		*p = abs
	}
	if opts.Keychain == nil {
		opts.Keychain = staticKeychain{}
	}
	orDefault(&opts.Timeout, contract.DefaultTimeout)
	orDefault(&opts.MaxExtractBytes, DefaultMaxExtractBytes)
	orDefault(&opts.CacheBudget, DefaultCacheBudget)
	orDefault(&opts.CacheMaxAge, DefaultCacheMaxAge)
	opts.Limits = opts.Limits.withDefaults()
	return &Worker{opts: opts}, nil
}

// Run carries out action for cfg and reports what happened. It never panics on bad input: every
// failure is a Failed Result with a Reason.
func (w *Worker) Run(ctx context.Context, action contract.Action, cfg contract.Config) contract.Result {
	ctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	res := baseResult(action, cfg)
	err := w.run(ctx, action, cfg, &res)
	return finish(res, err)
}

// Failure is the Result of a run that could not start, e.g. because its config or pull secret
// could not be read; cfg may be the zero Config. An unclassified err counts as contract.ReasonOther.
func Failure(action contract.Action, cfg contract.Config, err error) contract.Result {
	return finish(baseResult(action, cfg), classified(contract.ReasonOther, err))
}

func baseResult(action contract.Action, cfg contract.Config) contract.Result {
	return contract.Result{
		Action:       action,
		Namespace:    cfg.Namespace,
		Name:         cfg.Name,
		KernelModule: cfg.Config.Modprobe.ModuleName,
		Version:      cfg.Config.Version,
		Kernel:       cfg.Config.KernelVersion,
	}
}

// finish sets the outcome of res from err.
func finish(res contract.Result, err error) contract.Result {
	if err == nil {
		res.Outcome = contract.OutcomeSucceeded
		return res
	}
	res.Outcome = contract.OutcomeFailed
	if res.Action == contract.ActionReload && res.FailedStep == "" {
		res.FailedStep = contract.StepUnload // it failed before anything was unloaded
	}
	res.Reason = ReasonOf(err)
	res.Message = err.Error()
	res.Stderr = stderrOf(err)
	return res
}

func (w *Worker) run(ctx context.Context, action contract.Action, cfg contract.Config, res *contract.Result) error {
	switch action {
	case contract.ActionLoad, contract.ActionUnload, contract.ActionReload:
	default:
		return errorf(contract.ReasonOther, "unknown action %q: use load, unload or reload", action)
	}
	if err := cfg.ValidateFor(action); err != nil {
		return classified(contract.ReasonInvalidConfig, err)
	}
	log := w.opts.Log.WithValues("module", cfg.ModuleID(), "kernel", cfg.Config.KernelVersion, "action", action)
	bootID, err := w.opts.Host.BootID()
	if err != nil {
		return classified(contract.ReasonOther, err)
	}
	res.BootID = bootID
	if action == contract.ActionReload {
		return w.reload(ctx, log, cfg, res)
	}
	img, err := w.fetchLogged(ctx, log, cfg.Namespace, cfg.Config)
	if img.release != nil {
		defer img.release()
	}
	if err != nil {
		return err
	}
	res.ImageDigest, res.FromCache = img.digest.String(), img.fromCache
	log = log.WithValues("digest", res.ImageDigest)
	if action == contract.ActionLoad {
		err = w.load(ctx, log, cfg, img.root)
	} else {
		err = w.unload(ctx, log, cfg, img.root)
	}
	return deadlineError(err, ctx.Err(), w.opts.Timeout, contract.ReasonOther, string(action)+"ing the module")
}

// fetchLogged fetches the image of mc, logging it, with a timed-out pull reported as such.
func (w *Worker) fetchLogged(ctx context.Context, log logr.Logger, namespace string, mc kmmv1beta1.ModuleConfig) (fetched, error) {
	log.Info("Fetching the kmod image", "image", mc.ContainerImage, "pullPolicy", mc.ImagePullPolicy)
	img, err := w.fetch(ctx, namespace, mc)
	if err != nil {
		return img, deadlineError(err, ctx.Err(), w.opts.Timeout, contract.ReasonImagePull, "pulling and extracting the image")
	}
	log.Info("Image ready", "digest", img.digest.String(), "fromCache", img.fromCache, "root", img.root)
	return img, nil
}

// reload unloads cfg.Previous and then loads cfg.Config. Both images are fetched first, so that a
// pull failure leaves the previous config loaded; res.FailedStep says which half failed. The
// result's digest is the new image's.
func (w *Worker) reload(ctx context.Context, log logr.Logger, cfg contract.Config, res *contract.Result) (err error) {
	res.FailedStep = contract.StepUnload
	defer func() {
		if err == nil {
			res.FailedStep = ""
		}
	}()
	prev := cfg
	prev.Config, prev.Previous = *cfg.Previous, nil
	old, err := w.fetchLogged(ctx, log.WithValues("half", contract.StepUnload), cfg.Namespace, prev.Config)
	if old.release != nil {
		defer old.release()
	}
	if err != nil {
		return err
	}
	img, err := w.fetchLogged(ctx, log.WithValues("half", contract.StepLoad), cfg.Namespace, cfg.Config)
	if img.release != nil {
		defer img.release()
	}
	if err != nil {
		return err
	}
	res.ImageDigest, res.FromCache = img.digest.String(), img.fromCache
	if err := w.unload(ctx, log.WithValues("digest", old.digest.String()), prev, old.root); err != nil {
		return deadlineError(err, ctx.Err(), w.opts.Timeout, contract.ReasonOther, "unloading the previous module")
	}
	res.FailedStep = contract.StepLoad
	err = w.load(ctx, log.WithValues("digest", res.ImageDigest), cfg, img.root)
	return deadlineError(err, ctx.Err(), w.opts.Timeout, contract.ReasonOther, "loading the module")
}

// fetched is an image in the cache.
type fetched struct {
	digest    v1.Hash
	root      string
	fromCache bool
	// release releases the shared lock on the digest that keeps eviction away while it is used.
	release func()
}

// fetch makes sure the image's wanted subtrees are in the cache, asking the registry only when the
// digest is unknown (or imagePullPolicy is Always), the entry is missing, or this Module's
// credentials have not yet proven access to the digest (see cachedFor).
func (w *Worker) fetch(ctx context.Context, namespace string, mc kmmv1beta1.ModuleConfig) (fetched, error) {
	reg, err := newRegistryClient(ctx, mc, pullSettings{
		sources: w.opts.Registries, trust: w.opts.Trust, kc: w.opts.Keychain,
		base: w.opts.Transport, maxManifest: w.opts.Limits.MaxManifestBytes,
	})
	if err != nil {
		return fetched{}, err
	}
	c, key := cache{dir: w.opts.CacheDir, staleAfter: 2 * w.opts.Timeout}, extractKey(mc)
	id := accessIdentity(namespace, reg, w.opts.Keychain)
	d, known, err := knownDigest(reg, c, mc.ImagePullPolicy)
	if err != nil {
		return fetched{}, err
	}
	var release func()
	if known {
		release = w.lockDigest(c, d)
		if c.has(d, key) {
			out, err := w.cachedFor(reg, c, d, key, id, mc.ImagePullPolicy)
			out.release = release
			return out, err
		}
		release()
	}
	if mc.ImagePullPolicy == corev1.PullNever {
		return fetched{}, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("%s: %w", mc.ContainerImage, errNotCached)}
	}
	d, img, err := reg.get()
	if err != nil {
		return fetched{}, err
	}
	if err := checkImage(img, w.opts.Limits); err != nil {
		return fetched{}, err
	}
	release = w.lockDigest(c, d)
	out := fetched{digest: d, root: c.entry(d, key), fromCache: c.has(d, key), release: release}
	if !out.fromCache {
		spec := extractSpec{
			Filter:      newFilter(mc, w.opts.HostModulesDir),
			KernelDir:   kernelDir(mc),
			FirmwareDir: firmwareDir(mc),
			MaxBytes:    w.opts.MaxExtractBytes,
			Limits:      w.opts.Limits,
		}
		if err := c.fill(ctx, d, key, img, spec); err != nil {
			return fetched{release: release}, classified(contract.ReasonOther, fmt.Errorf("extracting %s: %w", mc.ContainerImage, err))
		}
		w.evict(c)
	}
	w.remember(c, reg, d, id)
	return out, nil
}

// cachedFor returns the cached entry of d when the identity id has proven access to it: recorded
// in the cache, or proven now with one manifest HEAD request for the digest with the Module's
// credentials (imagePullPolicy Always already asked the registry). With imagePullPolicy Never an
// unproven identity fails: Never forbids asking the registry, and the cache must not hand a
// private image to a Module that may not pull it.
func (w *Worker) cachedFor(reg *registryClient, c cache, d v1.Hash, key, id string, policy corev1.PullPolicy) (fetched, error) {
	out := fetched{digest: d, root: c.entry(d, key), fromCache: true}
	if policy != corev1.PullAlways && !c.hasAccess(d, id) {
		if policy == corev1.PullNever {
			return fetched{}, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("%s: %w", reg.ref, errNotProven)}
		}
		if err := reg.headDigest(d); err != nil {
			return fetched{}, err
		}
	}
	w.remember(c, reg, d, id)
	return out, nil
}

// lockDigest takes the shared lock of d (eviction skips a locked entry) and returns its release.
// Without the lock (a cache that cannot hold lock files) the run goes on: eviction then may remove
// the entry under it, which makes a later run download it again.
func (w *Worker) lockDigest(c cache, d v1.Hash) func() {
	release, err := c.lock(d.Hex, syscall.LOCK_SH)
	if err != nil {
		w.opts.Log.Error(err, "Could not lock the cache entry")
		return func() {}
	}
	c.use(d.Hex)
	return release
}

// evict applies the eviction rule after a new entry was filled.
func (w *Worker) evict(c cache) {
	removed, err := c.evict(time.Now(), w.opts.CacheMaxAge, w.opts.CacheBudget)
	if err != nil {
		w.opts.Log.Error(err, "Cache eviction failed")
	}
	if len(removed) > 0 {
		w.opts.Log.Info("Evicted cache entries", "digests", removed)
	}
}

// remember records that id may use d and, for a tag, the digest it resolved to.
func (w *Worker) remember(c cache, reg *registryClient, d v1.Hash, id string) {
	if err := c.recordAccess(d, id); err != nil {
		w.opts.Log.Error(err, "Could not record the access check; the next run will ask the registry again")
	}
	if _, isTag := reg.ref.(name.Tag); isTag {
		if err := c.recordRef(reg.ref.Name(), d); err != nil {
			w.opts.Log.Error(err, "Could not record the image digest; the next run will ask the registry again")
		}
	}
}

// knownDigest returns the digest of the reference when it is known without downloading the
// manifest: from a digest reference, from a HEAD request with imagePullPolicy Always, or from the
// cache's record of the tag.
func knownDigest(reg *registryClient, c cache, policy corev1.PullPolicy) (v1.Hash, bool, error) {
	if dg, ok := reg.ref.(name.Digest); ok {
		h, err := v1.NewHash(dg.DigestStr())
		return h, err == nil, nil
	}
	if policy == corev1.PullAlways {
		h, err := reg.head()
		return h, err == nil, err
	}
	h, ok := c.lookupRef(reg.ref.Name())
	return h, ok, nil
}

// newFilter selects the kernel directory and the firmware directory of mc, and allows the host
// link of the kernel directory when the worker sees the node's module tree at hostModules.
func newFilter(mc kmmv1beta1.ModuleConfig, hostModules string) filter {
	f := filter{Dirs: []string{kernelDir(mc)}, HostLink: hostLink(mc), HostLinkTarget: path.Join(contract.HostModulesDir, mc.KernelVersion)}
	if hostModules != "" {
		f.HostTarget = filepath.Join(hostModules, mc.KernelVersion)
	}
	if fw := firmwareDir(mc); fw != "" {
		f.Dirs = append(f.Dirs, fw)
	}
	return f
}

// load checks what modprobe would insmod, removes in-tree modules, installs firmware and loads
// the module: a refused module index changes nothing on the node.
func (w *Worker) load(ctx context.Context, log logr.Logger, cfg contract.Config, root string) error {
	mc := cfg.Config
	softdep, cleanup, err := w.writeSoftdep(mc.Modprobe.ModulesLoadingOrder)
	if err != nil {
		return classified(contract.ReasonOther, err)
	}
	defer cleanup()
	args, err := LoadArgs(mc, ArgvOptions{Root: filepath.Join(root, modulesRoot(mc)), ImageRoot: root, SoftdepFile: softdep, DryRun: w.opts.DryRun})
	if err != nil {
		return classified(contract.ReasonOther, err)
	}
	if err := w.checkDepends(ctx, log, args, w.moduleDirs(root, mc)); err != nil {
		return err
	}
	for _, m := range mc.InTreeModulesToRemove {
		if err := w.removeInTree(ctx, log, m, mc.KernelVersion); err != nil {
			return err
		}
	}
	if err := w.installFirmware(log, cfg, root); err != nil {
		return err
	}
	log.Info("Loading the module", "args", args)
	return w.modprobe(ctx, log, args)
}

func (w *Worker) unload(ctx context.Context, log logr.Logger, cfg contract.Config, root string) error {
	mc := cfg.Config
	args, err := UnloadArgs(mc, ArgvOptions{Root: filepath.Join(root, modulesRoot(mc)), ImageRoot: root, DryRun: w.opts.DryRun})
	if err != nil {
		return classified(contract.ReasonOther, err)
	}
	log.Info("Unloading the module", "args", args)
	if err := w.modprobe(ctx, log, args); err != nil {
		return err
	}
	fw := firmwareDir(mc)
	if fw == "" {
		return nil
	}
	return withFS(root, fw, func(src fs.FS) error {
		log.Info("Removing firmware", "dir", firmwareHostPath(cfg))
		return classified(contract.ReasonOther, w.opts.Host.RemoveFirmware(src, firmwareHostPath(cfg)))
	})
}

// moduleDirs are the directories modprobe may load module files from: the image's module
// directory and, when the worker sees the node's module tree, that tree for the same kernel (the
// in-tree modules the image's host link reaches).
func (w *Worker) moduleDirs(root string, mc kmmv1beta1.ModuleConfig) []string {
	dirs := []string{filepath.Join(root, kernelDir(mc))}
	if w.opts.HostModulesDir != "" {
		dirs = append(dirs, filepath.Join(w.opts.HostModulesDir, mc.KernelVersion))
	}
	return dirs
}

// checkDepends runs modprobe --show-depends with the load's arguments and refuses the load when a
// module file it would insmod does not resolve (symlinks included) inside the image's module
// directory or the node's tree of the same kernel: a crafted modules.dep.bin can name any file of
// the node. A rawArgs load is checked the same way, after LoadArgs checked and rewrote its argv.
func (w *Worker) checkDepends(ctx context.Context, log logr.Logger, loadArgs []string, moduleDirs []string) error {
	args := ShowDependsArgs(loadArgs)
	if args == nil {
		return nil
	}
	stdout, stderr, err := w.opts.Modprobe.Run(ctx, args)
	if err != nil {
		return modprobeError("modprobe failed", args, stderr, err)
	}
	paths := insmodPaths(string(stdout))
	log.V(1).Info("Module files to load", "paths", paths)
	return checkInside(moduleDirs, paths)
}

// checkInside refuses a path that does not resolve inside one of dirs (the first is the image's
// module directory and must exist; the others may be missing).
func checkInside(dirs []string, paths []string) error {
	realDirs := make([]string, 0, len(dirs))
	for i, d := range dirs {
		real, err := filepath.EvalSymlinks(d)
		if err != nil && i == 0 {
			return classified(contract.ReasonOther, fmt.Errorf("resolving the module directory: %w", err))
		}
		if err == nil {
			realDirs = append(realDirs, real)
		}
	}
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return errorf(contract.ReasonOther, "refusing to load %s: it does not resolve inside the module directory of the image: %v", p, err)
		}
		if !slices.ContainsFunc(realDirs, func(d string) bool { return isInside(d, real) }) {
			return errorf(contract.ReasonOther, "refusing to load %s: it resolves to %s, outside the module directory of the image and the node's modules of the kernel", p, real)
		}
	}
	return nil
}

// isInside reports whether the clean absolute path p is dir or below it.
func isInside(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}

// removeInTree removes an in-tree module, treating "not loaded" as done.
func (w *Worker) removeInTree(ctx context.Context, log logr.Logger, module, kernel string) error {
	args := InTreeRemoveArgs(module, kernel, w.opts.DryRun)
	log.Info("Removing an in-tree module", "name", module, "args", args)
	_, stderr, err := w.opts.Modprobe.Run(ctx, args)
	if err != nil && notLoaded(string(stderr)) {
		log.Info("The in-tree module is not loaded", "name", module)
		return nil
	}
	if err != nil {
		return modprobeError(fmt.Sprintf("removing in-tree module %s", module), args, stderr, err)
	}
	return nil
}

// installFirmware copies the image's firmware to the host and sets the kernel's lookup path.
func (w *Worker) installFirmware(log logr.Logger, cfg contract.Config, root string) error {
	fw := firmwareDir(cfg.Config)
	if fw == "" {
		return nil
	}
	dest := firmwareHostPath(cfg)
	return withFS(root, fw, func(src fs.FS) error {
		log.Info("Installing firmware", "from", "/"+fw, "to", dest)
		if err := w.opts.Host.InstallFirmware(src, dest); err != nil {
			return classified(contract.ReasonOther, err)
		}
		if !cfg.SetFirmwareClassPath {
			return nil
		}
		log.Info("Setting the firmware lookup path", "path", dest)
		return classified(contract.ReasonOther, w.opts.Host.SetFirmwareClassPath(dest))
	})
}

// withFS calls fn with the directory dir of the extraction root, as a file system whose links
// resolve only inside the extraction root.
func withFS(root, dir string, fn func(fs.FS) error) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return classified(contract.ReasonOther, err)
	}
	defer r.Close() //nolint:errcheck // read-only handle
	sub, err := fs.Sub(r.FS(), dir)
	if err != nil {
		return classified(contract.ReasonOther, err)
	}
	return fn(sub)
}

// writeSoftdep writes the softdep config of a modulesLoadingOrder, if it has more than one entry.
func (w *Worker) writeSoftdep(order []string) (string, func(), error) {
	content := SoftdepConfig(order)
	if content == "" {
		return "", func() {}, nil
	}
	dir, err := os.MkdirTemp(w.opts.TempDir, "kmm-modprobe.d-")
	if err != nil {
		return "", nil, fmt.Errorf("writing the softdep config: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	file := filepath.Join(dir, "softdep.conf")
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("writing the softdep config: %w", err)
	}
	return file, cleanup, nil
}

func (w *Worker) modprobe(ctx context.Context, log logr.Logger, args []string) error {
	stdout, stderr, err := w.opts.Modprobe.Run(ctx, args)
	if len(stdout) > 0 {
		log.Info("modprobe output", "stdout", strings.TrimSpace(string(stdout)))
	}
	if err != nil {
		return modprobeError("modprobe failed", args, stderr, err)
	}
	return nil
}

// modprobeError classifies a failed modprobe run by its standard error, whose last line ends the message.
func modprobeError(what string, args []string, stderr []byte, err error) error {
	msg := fmt.Sprintf("%s: modprobe %s: %v", what, strings.Join(args, " "), err)
	lines := strings.Split(strings.TrimSpace(string(stderr)), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		msg += ": " + last
	}
	return &Error{Reason: classifyModprobe(string(stderr)), Err: errors.New(msg), Stderr: string(stderr)}
}

// deadlineError reclassifies the failure of a run whose deadline passed (ctxErr is the run
// context's error): the message says it timed out and during what, and the reason is the one of
// that step (ImagePull while pulling and extracting, Other while loading or unloading).
func deadlineError(err, ctxErr error, timeout time.Duration, reason contract.Reason, during string) error {
	if err == nil || !errors.Is(ctxErr, context.DeadlineExceeded) {
		return err
	}
	return &Error{Reason: reason, Err: fmt.Errorf("timed out after %s while %s: %w", timeout, during, err), Stderr: stderrOf(err)}
}
