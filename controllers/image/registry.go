package image

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/shared"
	"github.com/kmm-project/kmm/preflight"
	"github.com/kmm-project/kmm/registry"
)

// registrySettings are the registry settings of the check that the operator can read itself: the
// registries.conf and CA bundle ConfigMaps of the Module's namespace (RegistryOptions'
// RegistriesConfigMap and CABundleConfigMap, the worker's --operator-registries-conf and
// --ca-bundle), one GET each, bounded as the worker bounds the files (registry.MaxConfigBytes,
// registry.MaxCABytes). A ConfigMap that does not exist adds nothing, as the pods' optional volume.
// The nodes' own files and credential providers are read in the pods only (docs/build.md).
func (r *Reconciler) registrySettings(ctx context.Context, ns string) (registry.Settings, registry.Trust, error) {
	var s registry.Settings
	var t registry.Trust
	o := r.RegistrySettings
	if data, file, err := r.configMapKey(ctx, ns, o.RegistriesConfigMap, shared.RegistriesConfKey, registry.MaxConfigBytes); err != nil {
		return s, t, err
	} else if data != nil {
		conf, err := registry.ParseRegistriesConf(file, data)
		if err != nil {
			return s, t, err
		}
		s.Operator = []registry.RegistriesConf{conf}
	}
	data, _, err := r.configMapKey(ctx, ns, o.CABundleConfigMap, shared.CABundleKey, registry.MaxCABytes)
	if data != nil {
		t.BundlePEM = [][]byte{data}
	}
	return s, t, err
}

// configMapKey reads key of the ConfigMap ns/name ("" or absent: nil), at most limit bytes; file
// names it in messages.
func (r *Reconciler) configMapKey(ctx context.Context, ns, name, key string, limit int) ([]byte, string, error) {
	if name == "" {
		return nil, "", nil
	}
	file := fmt.Sprintf("ConfigMap %s/%s key %s", ns, name, key)
	cm := &corev1.ConfigMap{}
	err := r.reader().Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return nil, file, nil
	case err != nil:
		return nil, file, fmt.Errorf("reading the %s: %w", file, err)
	}
	v, ok := cm.Data[key]
	switch {
	case !ok:
		return nil, file, nil
	case len(v) > limit:
		return nil, file, fmt.Errorf("the %s is larger than %d bytes", file, limit)
	}
	return []byte(v), file, nil
}

// checkEndpoints asks each endpoint the settings give for img, in order (mirrors, then the origin),
// all within reg's timeout: found at one is found; otherwise the last endpoint (the origin, or the
// hosts.toml server that replaces it) decides, and the detail names every endpoint asked.
func checkEndpoints(ctx context.Context, reg preflight.Registry, img string, tls kmmv1beta1.TLSOptions, s registry.Settings, trust registry.Trust, kc authn.Keychain) preflight.CheckResult {
	var nameOpts []name.Option
	if tls.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref, err := name.ParseReference(img, nameOpts...)
	if err != nil {
		return preflight.CheckResult{Outcome: preflight.NotFound, Detail: "not an image reference: " + err.Error()}
	}
	eps, err := registry.Plan(ref, s, registry.ModuleTLS{Insecure: tls.Insecure, SkipVerify: tls.InsecureSkipTLSVerify})
	if err != nil {
		return preflight.CheckResult{Outcome: preflight.Unreachable, Detail: err.Error()}
	}
	timeout := reg.Timeout
	if timeout <= 0 {
		timeout = preflight.DefaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last preflight.CheckResult
	var details []string
	for _, ep := range eps {
		last = checkEndpoint(ctx, reg, ep, ref, trust, kc)
		if last.Outcome == preflight.Found {
			return last
		}
		details = append(details, fmt.Sprintf("%s: %s %s", ep, last.Outcome, last.Detail))
	}
	if len(eps) > 1 {
		last.Detail = strings.Join(details, "; ")
	}
	return last
}

// checkEndpoint is one endpoint's answer: the preflight's HEAD with the endpoint's TLS settings
// and API root.
func checkEndpoint(ctx context.Context, reg preflight.Registry, ep registry.Endpoint, ref name.Reference, trust registry.Trust, kc authn.Keychain) preflight.CheckResult {
	epRef, err := ep.Reference(ref)
	if err != nil {
		return preflight.CheckResult{Outcome: preflight.Unreachable, Detail: err.Error()}
	}
	t, err := ep.Transport(reg.BaseTransport(), trust)
	if err != nil {
		return preflight.CheckResult{Outcome: preflight.Unreachable, Detail: err.Error()}
	}
	per := preflight.Registry{Transport: t, Timeout: time.Until(deadline(ctx))}
	if per.Timeout <= 0 {
		return preflight.CheckResult{Outcome: preflight.Unreachable, Detail: "no time left for this endpoint"}
	}
	return per.Check(ctx, preflight.Target{Image: epRef.String(), RegistryTLS: kmmv1beta1.TLSOptions{Insecure: ep.PlainHTTP}}, kc, nil)
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}
