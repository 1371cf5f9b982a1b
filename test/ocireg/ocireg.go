// Package ocireg runs go-containerregistry's in-process OCI registry behind httptest for tests,
// optionally behind HTTP basic authentication (a private registry), and pushes small random images
// and multi-platform indexes into it.
package ocireg

import (
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is a running in-process registry.
type Registry struct {
	// Host is host:port, for image references (plain HTTP: registryTLS.insecure, or TLS with a
	// certificate nobody trusts: registryTLS.insecureSkipTLSVerify).
	Host   string
	Server *httptest.Server
	user   string
	pass   string
}

// Options say how the registry is served.
type Options struct {
	// User and Password, when set, are the only credentials the registry accepts (basic auth).
	User, Password string
	// TLS serves HTTPS with httptest's self-signed certificate (CAPEM is it: a private CA).
	TLS bool
	// RefusePushTo are repositories (host excluded) whose uploads (POST, PUT, PATCH) are answered
	// 403 DENIED, as a registry answers credentials that may pull them but not push; pulls and
	// the other repositories are served.
	RefusePushTo []string
}

// Start starts a registry; the test's cleanup stops it.
func Start(t testing.TB, o Options) *Registry {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if len(o.RefusePushTo) > 0 {
		h = refusePush(h, o.RefusePushTo)
	}
	if o.User != "" {
		h = basicAuth(h, o.User, o.Password)
	}
	var srv *httptest.Server
	if o.TLS {
		srv = httptest.NewTLSServer(h)
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return &Registry{Host: strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://"), Server: srv, user: o.User, pass: o.Password}
}

// basicAuth answers 401 with a Basic challenge unless the request carries user:pass.
func basicAuth(next http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="kmm-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refusePush answers uploads to repos 403 with the distribution spec's DENIED error.
func refusePush(next http.Handler, repos []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refused := false
		for _, repo := range repos {
			refused = refused || strings.HasPrefix(r.URL.Path, "/v2/"+repo+"/")
		}
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			if !refused {
				break
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// CAPEM is the PEM certificate a TLS registry serves, self-signed: the CA to trust for it.
func (r *Registry) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.Server.Certificate().Raw})
}

// WriteImage writes img as repo:tag and returns its full reference.
func (r *Registry) WriteImage(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.Host + "/" + repoTag
	if err := remote.Write(r.ref(t, ref), img, r.opts()...); err != nil {
		t.Fatalf("writing %s: %v", ref, err)
	}
	return ref
}

// Push writes a small random image as repo:tag and returns its full reference.
func (r *Registry) Push(t testing.TB, repoTag string) string {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Host + "/" + repoTag
	if err := remote.Write(r.ref(t, ref), img, r.opts()...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

// PushIndex writes an index of one random image per platform as repo:tag and returns its reference.
func (r *Registry) PushIndex(t testing.TB, repoTag string, platforms ...v1.Platform) string {
	t.Helper()
	var idx v1.ImageIndex = empty.Index
	for _, p := range platforms {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	ref := r.Host + "/" + repoTag
	if err := remote.WriteIndex(r.ref(t, ref), idx, r.opts()...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	return ref
}

func (r *Registry) ref(t testing.TB, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func (r *Registry) opts() []remote.Option {
	opts := []remote.Option{remote.WithTransport(r.Server.Client().Transport)}
	if r.user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pass}))
	}
	return opts
}

// DockerConfigJSON is the .dockerconfigjson of a pull secret for this registry with user:pass.
func (r *Registry) DockerConfigJSON(user, pass string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	data, _ := json.Marshal(map[string]any{"auths": map[string]any{r.Host: map[string]string{"auth": auth}}})
	return data
}

// StartStalled starts a server that accepts requests and never answers (until the test ends), and
// returns its host:port.
func StartStalled(t testing.TB) string {
	t.Helper()
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-done:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	return strings.TrimPrefix(srv.URL, "http://")
}
