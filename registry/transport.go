package registry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Bounds of what Trust reads.
const (
	// MaxCABytes caps one CA file or bundle.
	MaxCABytes = 1 << 20
	// MaxCAFiles caps the CA files trusted for one endpoint (bundles, ca entries, certs.d files).
	MaxCAFiles = 64
)

// Trust are the CA certificates trusted beside the system's: cluster-wide bundles (PEM files, a
// ConfigMap mounted into the worker pod) and docker-style certs.d directories
// (<dir>/<host[:port]>/*.crt, as CRI-O, podman and Docker read them).
type Trust struct {
	// BundleFiles are PEM files of CA certificates trusted for every endpoint; a missing file is
	// skipped (an optional ConfigMap that does not exist).
	BundleFiles []string
	// CertsDirs are certs.d directories; a missing directory is skipped.
	CertsDirs []string
	// BundlePEM are PEM bundles given in memory, trusted for every endpoint (the operator reads
	// the CA bundle ConfigMap through the API; each at most MaxCABytes).
	BundlePEM [][]byte
}

// Reference is ref as served by the endpoint (same tag or digest, the endpoint's host and
// repository).
func (e Endpoint) Reference(ref name.Reference) (name.Reference, error) {
	var opts []name.Option
	if e.PlainHTTP {
		opts = append(opts, name.Insecure)
	}
	return name.ParseReference(e.Host+"/"+e.Repository+refSuffix(ref), opts...)
}

// Transport returns base with the endpoint's TLS settings (the system roots, the trusted bundles,
// the endpoint's CA files and certs.d files; verification off with SkipVerify) and its API root.
// base must be an *http.Transport for TLS settings to apply (nil means remote.DefaultTransport).
func (e Endpoint) Transport(base http.RoundTripper, trust Trust) (http.RoundTripper, error) {
	if base == nil {
		base = remote.DefaultTransport
	}
	if t, ok := base.(*http.Transport); ok {
		cfg, err := e.tlsConfig(t.TLSClientConfig, trust)
		if err != nil {
			return nil, err
		}
		t = t.Clone()
		t.TLSClientConfig = cfg
		base = t
	}
	if e.APIRoot != "" && e.APIRoot != "/v2" {
		base = apiRoot{base: base, host: e.Host, root: e.APIRoot}
	}
	return base, nil
}

// RemoteOptions are the go-containerregistry options to pull from the endpoint with kc's
// credentials; extra options come last.
func (e Endpoint) RemoteOptions(base http.RoundTripper, trust Trust, kc authn.Keychain, extra ...remote.Option) ([]remote.Option, error) {
	t, err := e.Transport(base, trust)
	if err != nil {
		return nil, err
	}
	return append([]remote.Option{remote.WithTransport(t), remote.WithAuthFromKeychain(kc)}, extra...), nil
}

func (e Endpoint) tlsConfig(base *tls.Config, trust Trust) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		cfg = base.Clone()
	}
	if e.SkipVerify {
		cfg.InsecureSkipVerify = true // #nosec G402 -- the registry configuration asked for it (skip_verify, insecure, insecureSkipTLSVerify)
		return cfg, nil
	}
	files, err := e.TrustedCAFiles(trust)
	if err != nil || len(files)+len(trust.BundlePEM) == 0 {
		return cfg, err
	}
	pool := cfg.RootCAs
	if pool == nil {
		if pool, err = x509.SystemCertPool(); err != nil {
			pool = x509.NewCertPool()
		}
	} else {
		pool = pool.Clone()
	}
	for i, pem := range trust.BundlePEM {
		if len(pem) > MaxCABytes || !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA bundle %d for %s holds no PEM certificate or is larger than %d bytes", i, e.Host, MaxCABytes)
		}
	}
	for _, f := range files {
		pem, err := readBounded(f, MaxCABytes)
		if errors.Is(err, os.ErrNotExist) && !slices.Contains(e.CAFiles, f) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("CA file for %s: %w", e.Host, err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s for %s holds no PEM certificate", f, e.Host)
		}
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// TrustedCAFiles lists the CA files of the endpoint: bundles, its own, then certs.d/<host>/*.crt
// (at most MaxCAFiles; a bundle file may not exist).
func (e Endpoint) TrustedCAFiles(trust Trust) ([]string, error) {
	files := append(append([]string(nil), trust.BundleFiles...), e.CAFiles...)
	for _, d := range trust.CertsDirs {
		m, err := filepath.Glob(filepath.Join(d, e.Host, "*.crt"))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	if len(files) > MaxCAFiles {
		return nil, fmt.Errorf("%d CA files for %s, more than %d", len(files), e.Host, MaxCAFiles)
	}
	return files, nil
}

// readBounded reads a file of at most max bytes.
func readBounded(file string, max int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read-only
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", file, max)
	}
	return data, nil
}

// apiRoot sends the requests for host's /v2 API to root instead (containerd's override_path, or a
// mirror URL with a path).
type apiRoot struct {
	base       http.RoundTripper
	host, root string
}

// RoundTrip implements http.RoundTripper.
func (a apiRoot) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host == a.host && (req.URL.Path == "/v2" || strings.HasPrefix(req.URL.Path, "/v2/")) {
		req = req.Clone(req.Context())
		req.URL.Path = a.root + strings.TrimPrefix(req.URL.Path, "/v2")
		req.URL.RawPath = ""
	}
	return a.base.RoundTrip(req)
}
