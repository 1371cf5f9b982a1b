package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// ChartDir is the Helm chart's directory under the repository root.
const ChartDir = "charts/kmm"

// LoadChart loads the chart in dir (a directory or a packaged .tgz).
func LoadChart(dir string) (*chart.Chart, error) {
	return loader.Load(dir)
}

// RenderChart renders ch as `helm template --include-crds -n namespace` does, with values, and
// returns its objects: the CRDs of crds/ first, then the templates'.
func RenderChart(ctx context.Context, ch *chart.Chart, release, namespace string, values map[string]any) ([]*unstructured.Unstructured, error) {
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	cfg.Releases = storage.Init(driver.NewMemory())
	cfg.Capabilities = common.DefaultCapabilities.Copy()
	cfg.KubeClient = &kubefake.PrintingKubeClient{Out: io.Discard}
	inst := action.NewInstall(cfg)
	inst.DryRunStrategy = action.DryRunClient
	inst.ReleaseName = release
	inst.Namespace = namespace
	inst.Replace = true
	inst.IncludeCRDs = true
	// The Kubernetes of test/tools (helm's own default is older than the chart's kubeVersion).
	inst.KubeVersion = &common.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	rel, err := inst.RunWithContext(ctx, ch, values)
	if err != nil {
		return nil, err
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		return nil, fmt.Errorf("helm returned a %T", rel)
	}
	return Decode([]byte(r.Manifest))
}

// Helm is a Helm SDK client of one cluster and namespace.
type Helm struct {
	cfg       *action.Configuration
	namespace string
}

// NewHelm returns a Helm client of the cluster of kubeconfig (a file) whose releases live in
// namespace (helm's Secret storage, as the helm command keeps them); log receives helm's log.
func NewHelm(kubeconfig, namespace string, log io.Writer) (*Helm, error) {
	if log == nil {
		log = io.Discard
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(log, nil)))
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &kubeconfig
	flags.Namespace = &namespace
	if err := cfg.Init(flags, namespace, "secret"); err != nil {
		return nil, err
	}
	return &Helm{cfg: cfg, namespace: namespace}, nil
}

// Install installs ch as release with values, server-side applied (helm 4's default), waiting
// until helm considers the objects ready with timeout; the namespace is created when missing.
func (h *Helm) Install(ctx context.Context, ch *chart.Chart, release string, values map[string]any, wait kube.WaitStrategy, timeout time.Duration) (*releasev1.Release, error) {
	inst := action.NewInstall(h.cfg)
	inst.ReleaseName = release
	inst.Namespace = h.namespace
	inst.CreateNamespace = true
	inst.ServerSideApply = true
	inst.WaitStrategy = wait
	inst.Timeout = timeout
	rel, err := inst.RunWithContext(ctx, ch, values)
	return asRelease(rel, err)
}

// Upgrade upgrades release to ch with values (not reusing the release's), server-side applied.
func (h *Helm) Upgrade(ctx context.Context, ch *chart.Chart, release string, values map[string]any, wait kube.WaitStrategy, timeout time.Duration) (*releasev1.Release, error) {
	up := action.NewUpgrade(h.cfg)
	up.Namespace = h.namespace
	up.ServerSideApply = "true"
	up.WaitStrategy = wait
	up.Timeout = timeout
	rel, err := up.RunWithContext(ctx, release, ch, values)
	return asRelease(rel, err)
}

// Uninstall uninstalls release (its hooks run; objects with helm.sh/resource-policy: keep and the
// CRDs of crds/ stay).
func (h *Helm) Uninstall(release string, timeout time.Duration) error {
	u := action.NewUninstall(h.cfg)
	u.WaitStrategy = kube.HookOnlyStrategy
	u.Timeout = timeout
	_, err := u.Run(release)
	return err
}

func asRelease(rel any, err error) (*releasev1.Release, error) {
	if err != nil {
		return nil, err
	}
	r, ok := rel.(*releasev1.Release)
	if !ok {
		return nil, fmt.Errorf("helm returned a %T", rel)
	}
	return r, nil
}

// ChartAt writes the chart as it was in commit of the git repository at root into a new
// directory under tmpDir and returns that directory.
func ChartAt(ctx context.Context, root, commit, tmpDir string) (string, error) {
	dir, err := os.MkdirTemp(tmpDir, "kmm-chart-")
	if err != nil {
		return "", err
	}
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit, ChartDir) //nolint:gosec // G204: git with our own arguments
	tar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)                                             //nolint:gosec // G204: tar into our own temporary directory
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", err
	}
	tar.Stdin = pipe
	var stderr strings.Builder
	archive.Stderr, tar.Stderr = &stderr, &stderr
	if err := tar.Start(); err != nil {
		return "", err
	}
	if err := errors.Join(archive.Run(), tar.Wait()); err != nil {
		return "", fmt.Errorf("git archive %s %s: %w: %s", commit, ChartDir, err, stderr.String())
	}
	return filepath.Join(dir, ChartDir), nil
}

// PreviousChartCommit returns the newest commit reachable from HEAD whose charts/kmm differs
// from HEAD's: the chart version before the current one, which `helm upgrade` comes from. Fails in
// a clone without that history (shallow), or before the chart has had two versions.
func PreviousChartCommit(ctx context.Context, root string) (string, error) {
	head, err := gitOut(ctx, root, "rev-parse", "HEAD:"+ChartDir)
	if err != nil {
		return "", err
	}
	log, err := gitOut(ctx, root, "log", "--format=%H", "HEAD", "--", ChartDir)
	if err != nil {
		return "", err
	}
	for c := range strings.FieldsSeq(log) {
		tree, err := gitOut(ctx, root, "rev-parse", "--verify", "--quiet", c+":"+ChartDir)
		if err != nil || tree == "" || tree == head {
			continue // the chart removed in c, or the same as HEAD's
		}
		return c, nil
	}
	return "", fmt.Errorf("no commit before HEAD holds another version of %s (a shallow clone? `git fetch --unshallow`)", ChartDir)
}

func gitOut(ctx context.Context, root string, args ...string) (string, error) {
	out, err := run(ctx, root, "git", append([]string{"-C", root}, args...)...)
	return strings.TrimSpace(string(out)), err
}
