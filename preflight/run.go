package preflight

import (
	"context"
	"fmt"
	"sort"

	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// DefaultConcurrency is how many image checks run at once by default: each is one or two small
// HTTP requests, so a few in flight finish a cluster's Modules quickly without flooding a registry.
const DefaultConcurrency = 8

// Options say what Run checks and how.
type Options struct {
	// Kernel is the target kernel version.
	Kernel string
	// Registry checks the images.
	Registry Registry
	// Concurrency bounds the image checks running at once (DefaultConcurrency when zero).
	Concurrency int
	// Secrets reads the Modules' pull secrets (Run's reader when nil): the operator reads them
	// uncached, one get each, instead of caching every Secret of the cluster.
	Secrets client.Reader
	// SecretsNamespaced says that the operator may read Secrets only in the namespaces where a
	// RoleBinding grants it (--secrets-cluster-wide=false): a refused read then names the
	// RoleBinding to create. Otherwise it names the missing ClusterRoleBinding.
	SecretsNamespaced bool
	// PushBuiltImage is the PreflightValidation's pushBuiltImage: a missing image of a Module that
	// builds or signs it in the cluster is being made for the target kernel by the image
	// controller, so its verdict is not final (checked again with back-off) until it exists.
	PushBuiltImage bool
}

// The RBAC objects a refused read of a pull secret points to (config/rbac).
const (
	SecretReaderRole    = "kmm-secret-reader"
	SecretReaderBinding = "kmm-secret-reader-rolebinding"
)

// forbiddenDetail says why the operator could not read a pull secret and what grants it.
func forbiddenDetail(namespace, name string, namespaced bool) string {
	if namespaced {
		return fmt.Sprintf("the operator may not get the imageRepoSecret %s/%s: it reads Secrets only in namespaces with a RoleBinding to the ClusterRole %s for its ServiceAccount (--secrets-cluster-wide=false); create one in %s (config/samples/secret-reader-rolebinding.yaml)",
			namespace, name, SecretReaderRole, namespace)
	}
	return fmt.Sprintf("the operator may not get the imageRepoSecret %s/%s: the ClusterRoleBinding %s (config/rbac) is missing or changed", namespace, name, SecretReaderBinding)
}

// Run verifies every Module the reader lists (those being deleted aside) for o.Kernel and returns
// the verdicts sorted by namespace and name. It fails only when it cannot read the Modules, the
// Nodes or a pull secret (other than one that does not exist, which is an Unauthorized verdict).
func Run(ctx context.Context, r client.Reader, o Options) ([]Verdict, error) {
	modules := &kmmv1beta1.ModuleList{}
	if err := r.List(ctx, modules); err != nil {
		return nil, fmt.Errorf("listing Modules: %w", err)
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	var live []*kmmv1beta1.Module
	for i := range modules.Items {
		if modules.Items[i].DeletionTimestamp.IsZero() {
			live = append(live, &modules.Items[i])
		}
	}
	sort.Slice(live, func(i, j int) bool { return key(live[i]) < key(live[j]) })
	return Verify(ctx, live, nodes.Items, r, o)
}

// Verify verifies the given Modules, with the nodes' platforms, reading pull secrets through
// o.Secrets (or r). The verdicts are in the order of modules.
func Verify(ctx context.Context, modules []*kmmv1beta1.Module, nodes []corev1.Node, r client.Reader, o Options) ([]Verdict, error) {
	secrets := o.Secrets
	if secrets == nil {
		secrets = r
	}
	limit := o.Concurrency
	if limit <= 0 {
		limit = DefaultConcurrency
	}
	out := make([]Verdict, len(modules))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for i, m := range modules {
		target, v := Plan(m, o.Kernel)
		if v != nil {
			out[i] = *v
			continue
		}
		g.Go(func() error {
			check, err := checkModule(gctx, secrets, o.SecretsNamespaced, o.Registry, m, target, Platforms(m, nodes))
			if err != nil {
				return err
			}
			out[i] = Decide(m, o.Kernel, check)
			if o.PushBuiltImage && check.Outcome == NotFound {
				awaitBuild(&out[i], m, o.Kernel)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// checkModule reads the Module's pull secret and checks its image.
func checkModule(ctx context.Context, secrets client.Reader, namespaced bool, reg Registry, m *kmmv1beta1.Module, t *Target, platforms []v1.Platform) (CheckResult, error) {
	var pull []corev1.Secret
	if t.PullSecret != "" {
		s := &corev1.Secret{}
		err := secrets.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: t.PullSecret}, s)
		if apierrors.IsNotFound(err) {
			return CheckResult{Outcome: Denied, Detail: fmt.Sprintf("the imageRepoSecret %s/%s does not exist", m.Namespace, t.PullSecret)}, nil
		}
		if apierrors.IsForbidden(err) {
			return CheckResult{Outcome: SecretForbidden, Detail: forbiddenDetail(m.Namespace, t.PullSecret, namespaced)}, nil
		}
		if err != nil {
			return CheckResult{}, fmt.Errorf("reading the imageRepoSecret %s/%s of Module %s: %w", m.Namespace, t.PullSecret, key(m), err)
		}
		pull = append(pull, *s)
	}
	kc, err := kauth.NewFromPullSecrets(ctx, pull)
	if err != nil {
		return CheckResult{Outcome: Denied, Detail: fmt.Sprintf("the imageRepoSecret %s/%s is not a pull secret: %v", m.Namespace, t.PullSecret, err)}, nil
	}
	return reg.Check(ctx, *t, kc, platforms), nil
}

// Platforms lists the platforms (os/architecture, from node.status.nodeInfo) of the nodes m selects,
// without repeats, sorted. Nodes that report none are left out.
func Platforms(m *kmmv1beta1.Module, nodes []corev1.Node) []v1.Platform {
	seen := map[string]bool{}
	var out []v1.Platform
	for i := range nodes {
		info := nodes[i].Status.NodeInfo
		p := info.OperatingSystem + "/" + info.Architecture
		if info.OperatingSystem == "" || info.Architecture == "" || seen[p] || !mapping.Selects(m, nodes[i].Labels) {
			continue
		}
		seen[p] = true
		out = append(out, v1.Platform{OS: info.OperatingSystem, Architecture: info.Architecture})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].OS+"/"+out[i].Architecture < out[j].OS+"/"+out[j].Architecture
	})
	return out
}

func key(m *kmmv1beta1.Module) string { return m.Namespace + "/" + m.Name }

// awaitBuild makes the ImageMissing verdict of a Module whose mapping for kernel builds or signs its
// image not final: with pushBuiltImage the image controller builds and signs it ahead of the
// upgrade, and the verdict turns Success once the image exists.
func awaitBuild(v *Verdict, m *kmmv1beta1.Module, kernel string) {
	if b, s := mapping.Recipe(m, kernel); b == nil && s == nil {
		return
	}
	v.Final = false
	v.Message = "being built and signed in the cluster for kernel " + kernel + " (pushBuiltImage): " + v.Message
}
