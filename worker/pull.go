package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
	"github.com/kmm-project/kmm/registry"
)

// ReadKeychain reads a pull secret in docker-config form (registry.ReadKeychain).
func ReadKeychain(file string) (authn.Keychain, error) { return registry.ReadKeychain(file) }

// ReadKeychainDir reads every pull secret file of dir into one keychain (registry.ReadKeychainDir).
func ReadKeychainDir(dir string) (authn.Keychain, error) { return registry.ReadKeychainDir(dir) }

// ParseKeychain parses a pull secret in docker-config form (registry.ParseKeychain).
func ParseKeychain(data []byte) (authn.Keychain, error) { return registry.ParseKeychain(data) }

// staticKeychain maps a registry host to credentials (registry.StaticKeychain).
type staticKeychain = registry.StaticKeychain

// registryHost normalises a docker-config key to host[:port] (registry.DockerConfigHost).
func registryHost(key string) string { return registry.DockerConfigHost(key) }

// registryClient pulls the image from the endpoints the registry configuration gives for it
// (mirrors, then the origin), with the TLS settings and credentials of each.
type registryClient struct {
	// ref is the image as the Module names it (the cache records tags under this name).
	ref       name.Reference
	endpoints []endpointClient
}

// endpointClient is one endpoint of the plan with its reference and options.
type endpointClient struct {
	ep   registry.Endpoint
	ref  name.Reference
	opts []remote.Option
}

// pullSettings are the registry configuration, trust and credentials of a run.
type pullSettings struct {
	sources     registry.Sources
	trust       registry.Trust
	kc          authn.Keychain
	base        http.RoundTripper
	maxManifest int64
}

func newRegistryClient(ctx context.Context, mc kmmv1beta1.ModuleConfig, ps pullSettings) (*registryClient, error) {
	var nameOpts []name.Option
	if mc.RegistryTLS.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref, err := name.ParseReference(mc.ContainerImage, nameOpts...)
	if err != nil {
		return nil, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("invalid image reference %q: %w", mc.ContainerImage, err)}
	}
	eps, err := registry.PlanFor(ps.sources, ref, registry.ModuleTLS{Insecure: mc.RegistryTLS.Insecure, SkipVerify: mc.RegistryTLS.InsecureSkipTLSVerify})
	if err != nil {
		return nil, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("pulling %s: %w", mc.ContainerImage, err)}
	}
	base := ps.base
	if base == nil {
		base = registryTransport()
	}
	rc := &registryClient{ref: ref}
	for _, ep := range eps {
		epRef, err := ep.Reference(ref)
		if err == nil {
			var t http.RoundTripper
			if t, err = ep.Transport(base, ps.trust); err == nil {
				rc.endpoints = append(rc.endpoints, endpointClient{ep: ep, ref: epRef, opts: []remote.Option{
					remote.WithContext(ctx),
					remote.WithAuthFromKeychain(ps.kc),
					remote.WithTransport(manifestLimiter{base: t, max: ps.maxManifest}),
					remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
					remote.WithUserAgent("kmm-worker"),
				}})
			}
		}
		if err != nil {
			return nil, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("pulling %s from %s: %w", mc.ContainerImage, ep, err)}
		}
	}
	return rc, nil
}

// try runs op against each endpoint in order until one succeeds. A limit error stops at once
// (the image, not the endpoint, is the problem); otherwise the error names every host tried.
func (r *registryClient) try(op func(endpointClient) error) error {
	var fails []endpointFailure
	for _, e := range r.endpoints {
		err := op(e)
		if err == nil {
			return nil
		}
		var le *limitError
		if errors.As(err, &le) {
			return pullError(r.ref.String(), err)
		}
		fails = append(fails, endpointFailure{ep: e.ep, err: err})
	}
	return pullFailure(r.ref.String(), fails)
}

// head resolves the reference to a digest with one manifest HEAD request per endpoint tried.
func (r *registryClient) head() (v1.Hash, error) {
	var d v1.Hash
	err := r.try(func(e endpointClient) error {
		desc, err := remote.Head(e.ref, e.opts...)
		if err == nil {
			d = desc.Digest
		}
		return err
	})
	return d, err
}

// headDigest checks with a manifest HEAD request that the credentials may pull the digest d
// from the reference's repository (at the first endpoint that answers for it).
func (r *registryClient) headDigest(d v1.Hash) error {
	return r.try(func(e endpointClient) error {
		desc, err := remote.Head(e.ref.Context().Digest(d.String()), e.opts...)
		if err == nil && desc.Digest != d {
			return fmt.Errorf("the registry answered for %s with digest %s", d, desc.Digest)
		}
		return err
	})
}

// accessIdentity names who asks for an image: the Module's namespace, the image's registry and,
// for every endpoint that may serve it, the repository and the credentials the keychain gives for
// it (hashed; anonymous counts as credentials too).
func accessIdentity(namespace string, reg *registryClient, kc authn.Keychain) string {
	h := sha256.New()
	_, _ = fmt.Fprintf(h, "%s\x00%s", namespace, reg.ref.Context().RegistryStr())
	for _, e := range reg.endpoints {
		var cred []byte
		if auth, err := kc.Resolve(e.ref.Context()); err == nil {
			if ac, err := auth.Authorization(); err == nil {
				cred, _ = json.Marshal(ac)
			}
		}
		_, _ = fmt.Fprintf(h, "\x00%s\x00%s", e.ref.Context().Name(), cred)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// get fetches the manifest from the first endpoint that serves it and returns the digest the
// reference resolves to and the image (the platform's image of an index). The layers come from
// the same endpoint. go-containerregistry verifies a digest reference's manifest and every
// layer's digest, whatever host served them.
func (r *registryClient) get() (v1.Hash, v1.Image, error) {
	var d v1.Hash
	var img v1.Image
	err := r.try(func(e endpointClient) error {
		desc, err := remote.Get(e.ref, e.opts...)
		if err != nil {
			return err
		}
		if img, err = desc.Image(); err != nil {
			return err
		}
		d = desc.Digest
		return nil
	})
	return d, img, err
}

// Transport timeouts: a registry that does not accept the connection, finish the TLS handshake or
// answer a request's headers in time fails the request (go-containerregistry retries a few times)
// well before the run's deadline. A body that stalls is cut by the run's deadline.
const (
	dialTimeout           = 10 * time.Second
	tlsHandshakeTimeout   = 10 * time.Second
	responseHeaderTimeout = 30 * time.Second
)

// registryTransport is go-containerregistry's default transport with the timeouts above.
func registryTransport() *http.Transport {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.TLSHandshakeTimeout = tlsHandshakeTimeout
	t.ResponseHeaderTimeout = responseHeaderTimeout
	return t
}

// manifestLimiter refuses manifest responses (images and indexes) over max bytes, before
// go-containerregistry reads them into memory (it allows 100 MiB).
type manifestLimiter struct {
	base http.RoundTripper
	max  int64
}

// RoundTrip implements http.RoundTripper.
func (m manifestLimiter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := m.base.RoundTrip(req)
	if err != nil || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	if resp.ContentLength > m.max {
		_ = resp.Body.Close()
		return nil, m.tooBig(resp.ContentLength)
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: m.max, err: m.tooBig(-1)}
	return resp, nil
}

func (m manifestLimiter) tooBig(n int64) error {
	if n < 0 {
		return overLimit("maxManifestBytes", m.max, "the manifest is more than %d bytes", m.max)
	}
	return overLimit("maxManifestBytes", m.max, "the manifest is %d bytes", n)
}

// limitedBody fails with err once more than left bytes were read.
type limitedBody struct {
	io.ReadCloser
	left int64
	err  error
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.left -= int64(n); b.left < 0 {
		return n, b.err
	}
	return n, err
}
