package preflight

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// Bounds of one image check (docs/api.md, PreflightValidation).
const (
	// DefaultCheckTimeout bounds one image check: the HEAD, go-containerregistry's retries and,
	// for an index, the GET of the index. A registry slower than that is Unreachable.
	DefaultCheckTimeout = 20 * time.Second
	// MaxIndexBytes is the largest image index read to find the nodes' platforms.
	MaxIndexBytes = 4 << 20
	// dialTimeout and responseHeaderTimeout cut a registry that does not accept the connection or
	// answer well inside the check timeout.
	dialTimeout           = 5 * time.Second
	responseHeaderTimeout = 10 * time.Second
)

// Registry checks that images exist. The zero value uses go-containerregistry's default transport
// with the timeouts above and DefaultCheckTimeout.
type Registry struct {
	// Transport is the base HTTP transport (tests pass an in-process registry's).
	Transport http.RoundTripper
	// Timeout bounds one check (DefaultCheckTimeout when zero).
	Timeout time.Duration
}

// Check asks the registry whether t.Image exists for every platform in platforms (an index must
// hold each; a single-platform image is taken as it is), with the credentials of kc.
func (r Registry) Check(ctx context.Context, t Target, kc authn.Keychain, platforms []v1.Platform) CheckResult {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var nameOpts []name.Option
	if t.RegistryTLS.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref, err := name.ParseReference(t.Image, nameOpts...)
	if err != nil {
		return CheckResult{Outcome: NotFound, Detail: "not an image reference: " + err.Error()}
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(r.transport(t.RegistryTLS)),
		remote.WithUserAgent("kmm-preflight"),
	}
	desc, err := remote.Head(ref, opts...)
	if err != nil {
		return classify(err)
	}
	res := CheckResult{Outcome: Found, Digest: desc.Digest.String()}
	if !desc.MediaType.IsIndex() || len(platforms) == 0 {
		return res
	}
	if desc.Size > MaxIndexBytes {
		return CheckResult{Outcome: NotFound, Detail: fmt.Sprintf("the image index is %d bytes, more than the %d kmm reads", desc.Size, MaxIndexBytes)}
	}
	missing, err := missingPlatforms(ref.Context().Digest(desc.Digest.String()), platforms, opts)
	if err != nil {
		return classify(err)
	}
	if len(missing) > 0 {
		return CheckResult{Outcome: NotFound, Digest: res.Digest, Detail: "the image index has no image for " + strings.Join(missing, ", ")}
	}
	return res
}

// missingPlatforms reads the index and lists the platforms (os/architecture) it has no image for.
func missingPlatforms(ref name.Reference, platforms []v1.Platform, opts []remote.Option) ([]string, error) {
	idx, err := remote.Index(ref, opts...)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, p := range platforms {
		found := false
		for _, m := range im.Manifests {
			if m.Platform != nil && m.Platform.OS == p.OS && m.Platform.Architecture == p.Architecture {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, p.OS+"/"+p.Architecture)
		}
	}
	sort.Strings(missing)
	return missing, nil
}

// classify turns a go-containerregistry error into an outcome: what the registry said when it
// answered, Unreachable when it did not (or failed itself).
func classify(err error) CheckResult {
	detail := err.Error()
	var terr *transport.Error
	if !errors.As(err, &terr) {
		return CheckResult{Outcome: Unreachable, Detail: detail}
	}
	switch terr.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		return CheckResult{Outcome: Denied, Detail: detail}
	case http.StatusNotFound:
		return CheckResult{Outcome: NotFound, Detail: detail}
	}
	for _, d := range terr.Errors {
		switch d.Code {
		case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
			return CheckResult{Outcome: NotFound, Detail: detail}
		case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
			return CheckResult{Outcome: Denied, Detail: detail}
		}
	}
	return CheckResult{Outcome: Unreachable, Detail: detail}
}

// BaseTransport is the transport checks start from: Transport, or go-containerregistry's default
// with the timeouts above.
func (r Registry) BaseTransport() http.RoundTripper {
	if r.Transport == nil {
		return defaultTransport
	}
	return r.Transport
}

// transport is the base transport with the Module's registryTLS applied as the worker applies it:
// certificate verification off only with insecureSkipTLSVerify (insecure, plain HTTP, is a
// property of the reference: name.Insecure).
func (r Registry) transport(o kmmv1beta1.TLSOptions) http.RoundTripper {
	base := r.Transport
	if base == nil {
		base = defaultTransport
	}
	t, ok := base.(*http.Transport)
	if !ok || !o.InsecureSkipTLSVerify {
		return base
	}
	t = t.Clone()
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	t.TLSClientConfig.InsecureSkipVerify = true // #nosec G402 -- the Module asked for it with registryTLS.insecureSkipTLSVerify
	return t
}

// defaultTransport is go-containerregistry's default transport with the timeouts above, shared so
// that checks of one registry reuse their connections.
var defaultTransport = func() *http.Transport {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = dialTimeout
	t.ResponseHeaderTimeout = responseHeaderTimeout
	return t
}()
