package worker

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// dockerConfig is the content of a pull secret: a .dockerconfigjson ({"auths": {...}}) or a legacy
// .dockercfg (the map alone).
type dockerConfig struct {
	Auths map[string]authn.AuthConfig `json:"auths"`
}

// ReadKeychain reads a pull secret in docker-config form and returns a keychain that answers for
// the registries it names (anonymous for the others). An empty file name gives the anonymous keychain.
func ReadKeychain(file string) (authn.Keychain, error) {
	if file == "" {
		return staticKeychain{}, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the pull secret: %w", err)
	}
	return ParseKeychain(data)
}

// ParseKeychain parses a pull secret in docker-config form.
func ParseKeychain(data []byte) (authn.Keychain, error) {
	var cfg dockerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("malformed pull secret: %w", err)
	}
	if cfg.Auths == nil {
		if err := json.Unmarshal(data, &cfg.Auths); err != nil {
			return nil, fmt.Errorf("malformed pull secret: %w", err)
		}
	}
	kc := staticKeychain{}
	for key, auth := range cfg.Auths {
		kc[registryHost(key)] = auth
	}
	return kc, nil
}

// staticKeychain maps a registry host (as name.Registry.RegistryStr gives it) to credentials.
type staticKeychain map[string]authn.AuthConfig

// Resolve implements authn.Keychain.
func (k staticKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if auth, ok := k[registryHost(r.RegistryStr())]; ok {
		return authn.FromConfig(auth), nil
	}
	return authn.Anonymous, nil
}

// registryHost normalises a docker-config key ("https://host:5000/v1/", "host:5000") to host[:port].
func registryHost(key string) string {
	if strings.Contains(key, "://") {
		if u, err := url.Parse(key); err == nil {
			key = u.Host
		}
	}
	key, _, _ = strings.Cut(key, "/")
	switch key {
	case "docker.io", "registry-1.docker.io":
		return name.DefaultRegistry
	}
	return key
}

// registryClient talks to the image's registry with the config's TLS settings and credentials.
type registryClient struct {
	ref  name.Reference
	opts []remote.Option
}

func newRegistryClient(ctx context.Context, mc kmmv1beta1.ModuleConfig, kc authn.Keychain, base http.RoundTripper, maxManifest int64) (*registryClient, error) {
	var nameOpts []name.Option
	if mc.RegistryTLS.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref, err := name.ParseReference(mc.ContainerImage, nameOpts...)
	if err != nil {
		return nil, &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("invalid image reference %q: %w", mc.ContainerImage, err)}
	}
	return &registryClient{ref: ref, opts: []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(manifestLimiter{base: transportFor(mc.RegistryTLS, base), max: maxManifest}),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithUserAgent("kmm-worker"),
	}}, nil
}

// transportFor returns the HTTP transport for the registry: base (or go-containerregistry's
// default) with certificate verification off when insecureSkipTLSVerify is set.
func transportFor(tlsOpts kmmv1beta1.TLSOptions, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = registryTransport()
	}
	t, ok := base.(*http.Transport)
	if !ok || !tlsOpts.InsecureSkipTLSVerify {
		return base
	}
	t = t.Clone()
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	t.TLSClientConfig.InsecureSkipVerify = true // #nosec G402 -- the Module asked for it with registryTLS.insecureSkipTLSVerify
	return t
}

// head resolves the reference to a digest with one manifest HEAD request.
func (r *registryClient) head() (v1.Hash, error) {
	desc, err := remote.Head(r.ref, r.opts...)
	if err != nil {
		return v1.Hash{}, pullError(r.ref.String(), err)
	}
	return desc.Digest, nil
}

// headDigest checks with one manifest HEAD request that the credentials may pull the digest d
// from the reference's repository.
func (r *registryClient) headDigest(d v1.Hash) error {
	if _, err := remote.Head(r.ref.Context().Digest(d.String()), r.opts...); err != nil {
		return pullError(r.ref.String(), err)
	}
	return nil
}

// accessIdentity names who asks for an image: the Module's namespace, the registry and the
// credentials the keychain gives for it (hashed; anonymous counts as credentials too).
func accessIdentity(namespace string, reg name.Registry, kc authn.Keychain) string {
	var cred []byte
	if auth, err := kc.Resolve(reg); err == nil {
		if ac, err := auth.Authorization(); err == nil {
			cred, _ = json.Marshal(ac)
		}
	}
	sum := sha256.Sum256([]byte(namespace + "\x00" + reg.RegistryStr() + "\x00" + string(cred)))
	return hex.EncodeToString(sum[:])
}

// get fetches the manifest and returns the digest the reference resolves to and the image (the
// platform's image of an index).
func (r *registryClient) get() (v1.Hash, v1.Image, error) {
	desc, err := remote.Get(r.ref, r.opts...)
	if err != nil {
		return v1.Hash{}, nil, pullError(r.ref.String(), err)
	}
	img, err := desc.Image()
	if err != nil {
		return v1.Hash{}, nil, pullError(r.ref.String(), err)
	}
	return desc.Digest, img, nil
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
