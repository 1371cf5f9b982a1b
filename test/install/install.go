// Package install installs kmm from config/ the way an administrator does: it renders a
// kustomization with bin/kustomize (built by `make tools`) and server-side applies the objects in
// install order, or deletes them in the reverse order. `make deploy` and `make undeploy`
// (test/install/kmm-deploy) and the install tests use it.
package install

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// FieldManager is the field manager of what Apply writes.
const FieldManager = "kmm-deploy"

// Scheme returns base (a new scheme with the Kubernetes kinds when nil) with the
// CustomResourceDefinition kind added, which Apply reads to wait for CRDs.
func Scheme(base *runtime.Scheme) *runtime.Scheme {
	if base == nil {
		base = runtime.NewScheme()
		utilruntime.Must(clientgoscheme.AddToScheme(base))
	}
	utilruntime.Must(apiextensionsv1.AddToScheme(base))
	return base
}

// Kustomize returns the path of bin/kustomize under the repository root, or an error saying how to
// build it.
func Kustomize(root string) (string, error) {
	path := filepath.Join(root, "bin", "kustomize")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s not found: run `make tools` in %s to build it", path, root)
	}
	return path, nil
}

// Overlay writes a kustomization into a new directory under tmpDir that builds base with images
// set by `kustomize edit set image` (name=reference each, e.g.
// kmm-manager=registry.example.com/kmm-manager:v1), and returns that directory.
func Overlay(ctx context.Context, kustomize, base, tmpDir string, images []string) (string, error) {
	abs, err := filepath.Abs(base)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(tmpDir, "kmm-overlay-")
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		return "", err
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		return "", err
	}
	if len(images) > 0 {
		args := append([]string{"edit", "set", "image"}, images...)
		if _, err := run(ctx, dir, kustomize, args...); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// Render runs `kustomize build dir` and returns its objects in the order kustomize printed them.
func Render(ctx context.Context, kustomize, dir string) ([]*unstructured.Unstructured, error) {
	out, err := run(ctx, "", kustomize, "build", dir)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// Decode reads a multi-document YAML stream of objects.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			continue
		}
		u := &unstructured.Unstructured{}
		// Through the unstructured JSON decoder, numbers are int64 as in objects read from the API.
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, err
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("an object without apiVersion or kind: %v", u.Object)
		}
		objs = append(objs, u)
	}
}

func run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	if strings.Contains(name, "/") {
		abs, err := filepath.Abs(name)
		if err != nil {
			return nil, err
		}
		name = abs
	}
	cmd := exec.CommandContext(ctx, name, args...) //nolint:gosec // G204: bin/kustomize with our own arguments
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// installOrder ranks kinds: what others need comes first (the namespace, the CRDs, the identity
// and its permissions, the Services), the webhook configuration last, once the operator that
// answers it is there. Delete goes the other way, CRDs last.
var installOrder = []string{
	"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "Role",
	"ClusterRoleBinding", "RoleBinding", "Secret", "ConfigMap", "Service", "Issuer", "Certificate",
	"Deployment", "ServiceMonitor", "ValidatingWebhookConfiguration",
}

func rank(u *unstructured.Unstructured) int {
	if i := slices.Index(installOrder, u.GetKind()); i >= 0 {
		return i
	}
	return len(installOrder) - 1
}

// Sorted returns objs in install order (stable within a kind).
func Sorted(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := slices.Clone(objs)
	slices.SortStableFunc(out, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })
	return out
}

// Apply server-side applies objs in install order as FieldManager, taking over fields other
// managers set. After the CRDs it waits until the API server serves them. With dryRun the API
// server checks every object and stores none (objects in a namespace that does not exist yet are
// refused, as by `kubectl apply --server-side --dry-run=server`).
func Apply(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, dryRun bool, log io.Writer) error {
	opts := []client.ApplyOption{client.FieldOwner(FieldManager), client.ForceOwnership}
	if dryRun {
		opts = append(opts, client.DryRunAll)
	}
	var crds []string
	sorted := Sorted(objs)
	for i, u := range sorted {
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), opts...); err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), name(u), err)
		}
		if log != nil {
			_, _ = fmt.Fprintf(log, "%s %s applied%s\n", strings.ToLower(u.GetKind()), name(u), map[bool]string{true: " (server dry run)"}[dryRun])
		}
		if u.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, u.GetName())
		}
		last := i+1 == len(sorted) || sorted[i+1].GetKind() != "CustomResourceDefinition"
		if last && len(crds) > 0 && !dryRun {
			if err := waitEstablished(ctx, c, crds); err != nil {
				return err
			}
			crds = nil
		}
	}
	return nil
}

func name(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetName()
	}
	return u.GetNamespace() + "/" + u.GetName()
}

func waitEstablished(ctx context.Context, c client.Client, names []string) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKey{Name: n}, crd); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			established := false
			for _, cond := range crd.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					established = true
				}
			}
			if !established {
				return false, nil
			}
		}
		return true, nil
	})
}

// ErrModulesLeft is returned by Delete while Modules exist: deleting the operator (or the CRDs)
// first would leave their kmods loaded and their finalizers unremovable.
var ErrModulesLeft = errors.New("modules still exist: delete them and wait until they are gone (the operator unloads their kmods), or force")

// Delete deletes objs in the reverse of install order, the CRDs last. Unless force, it refuses
// while any Module exists. Objects already gone are skipped; it does not wait for deletions to
// finish.
func Delete(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, force bool, log io.Writer) error {
	if !force {
		modules := &unstructured.UnstructuredList{}
		modules.SetAPIVersion("kmm.sigs.x-k8s.io/v1beta1")
		modules.SetKind("ModuleList")
		err := c.List(ctx, modules, client.Limit(1))
		switch {
		case err == nil && len(modules.Items) > 0:
			m := modules.Items[0]
			return fmt.Errorf("%w (first: %s/%s)", ErrModulesLeft, m.GetNamespace(), m.GetName())
		case err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err):
			return fmt.Errorf("listing Modules: %w", err)
		}
	}
	sorted := Sorted(objs)
	slices.Reverse(sorted)
	// The Namespace goes just before the CRDs (its deletion removes what kmm created in it: the
	// certificate Secret, the leader election Lease), the CRDs last.
	slices.SortStableFunc(sorted, func(a, b *unstructured.Unstructured) int {
		return crdRank(a) - crdRank(b)
	})
	for _, u := range sorted {
		err := c.Delete(ctx, u.DeepCopy(), client.PropagationPolicy("Background"))
		if err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return fmt.Errorf("deleting %s %s: %w", u.GetKind(), name(u), err)
		}
		if log != nil {
			_, _ = fmt.Fprintf(log, "%s %s deleted\n", strings.ToLower(u.GetKind()), name(u))
		}
	}
	return nil
}

func crdRank(u *unstructured.Unstructured) int {
	if u.GetKind() == "CustomResourceDefinition" {
		return 1
	}
	return 0
}

// Find returns the object of kind and name in objs, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			return u
		}
	}
	return nil
}

// ContainerArgs returns the args of the named container of a Deployment with the $(VAR)
// references to the container's env values expanded as the kubelet does ($$ escapes; references to
// unknown or valueFrom variables stay as they are).
func ContainerArgs(deploy *unstructured.Unstructured, container string) ([]string, error) {
	containers, _, err := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return nil, err
	}
	for _, c := range containers {
		m, _ := c.(map[string]any)
		if m["name"] != container {
			continue
		}
		env := map[string]string{}
		list, _, _ := unstructured.NestedSlice(m, "env")
		for _, e := range list {
			em, _ := e.(map[string]any)
			n, _ := em["name"].(string)
			if v, ok := em["value"].(string); ok {
				env[n] = v
			}
		}
		raw, _, err := unstructured.NestedStringSlice(m, "args")
		if err != nil {
			return nil, err
		}
		out := make([]string, len(raw))
		for i, a := range raw {
			out[i] = expand(a, env)
		}
		return out, nil
	}
	return nil, fmt.Errorf("deployment %s has no container %q", deploy.GetName(), container)
}

// expand replaces $(NAME) by env[NAME] and $$ by $, leaving other text as it is.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			ref := s[i+2 : i+2+end]
			if v, ok := env[ref]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
