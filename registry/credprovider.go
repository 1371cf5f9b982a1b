package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The kubelet credential provider exec protocol (credentialprovider.kubelet.k8s.io/v1) and its
// configuration (kubelet.config.k8s.io/v1 CredentialProviderConfig). k8s.io/kubelet is not a
// dependency: these are the small documented JSON types, with the fields kmm uses.
const (
	// ProviderAPIVersion is the only plugin protocol version kmm speaks.
	ProviderAPIVersion = "credentialprovider.kubelet.k8s.io/v1"
	requestKind        = "CredentialProviderRequest"
	responseKind       = "CredentialProviderResponse"
)

// Bounds of the credential provider plugins.
const (
	// MaxProviders caps the providers of a CredentialProviderConfig.
	MaxProviders = 32
	// MaxMatchImages caps the matchImages of one provider.
	MaxMatchImages = 64
	// ProviderTimeout bounds one plugin run.
	ProviderTimeout = 30 * time.Second
	// MaxProviderResponse caps a plugin's standard output.
	MaxProviderResponse = 64 << 10
	// maxProviderStderr is the tail of a failed plugin's standard error kept in the message.
	maxProviderStderr = 1024
)

// CredentialProviderConfig is the kubelet's --image-credential-provider-config file.
type CredentialProviderConfig struct {
	APIVersion string               `json:"apiVersion"`
	Kind       string               `json:"kind"`
	Providers  []CredentialProvider `json:"providers"`
}

// CredentialProvider is one plugin of the config.
type CredentialProvider struct {
	// Name is the plugin's file name in the bin directory.
	Name string `json:"name"`
	// MatchImages are the image patterns the plugin is run for (kubelet's glob rules).
	MatchImages []string `json:"matchImages"`
	// DefaultCacheDuration applies when the response has no cacheDuration.
	DefaultCacheDuration *metav1.Duration `json:"defaultCacheDuration,omitempty"`
	// APIVersion is the protocol version; kmm speaks credentialprovider.kubelet.k8s.io/v1.
	APIVersion string `json:"apiVersion"`
	// Args and Env are given to the plugin (Env on top of the worker's environment).
	Args []string     `json:"args,omitempty"`
	Env  []ExecEnvVar `json:"env,omitempty"`
}

// ExecEnvVar is one environment variable of a plugin.
type ExecEnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type providerRequest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Image      string `json:"image"`
}

type providerResponse struct {
	APIVersion    string                  `json:"apiVersion"`
	Kind          string                  `json:"kind"`
	CacheKeyType  string                  `json:"cacheKeyType"`
	CacheDuration *metav1.Duration        `json:"cacheDuration,omitempty"`
	Auth          map[string]providerAuth `json:"auth"`
}

type providerAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// ParseCredentialProviderConfig parses and checks a CredentialProviderConfig (YAML or JSON).
func ParseCredentialProviderConfig(data []byte) (CredentialProviderConfig, error) {
	var c CredentialProviderConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("malformed CredentialProviderConfig: %w", err)
	}
	if c.Kind != "CredentialProviderConfig" || !strings.HasPrefix(c.APIVersion, "kubelet.config.k8s.io/") {
		return c, fmt.Errorf("want a kubelet.config.k8s.io CredentialProviderConfig, got %s %s", c.APIVersion, c.Kind)
	}
	if len(c.Providers) > MaxProviders {
		return c, fmt.Errorf("%d providers, more than %d", len(c.Providers), MaxProviders)
	}
	for _, p := range c.Providers {
		switch {
		case p.Name == "" || strings.ContainsAny(p.Name, `/\`) || p.Name == "." || p.Name == "..":
			return c, fmt.Errorf("provider name %q must be a file name", p.Name)
		case p.APIVersion != ProviderAPIVersion:
			return c, fmt.Errorf("provider %s: apiVersion %q: kmm speaks %s only", p.Name, p.APIVersion, ProviderAPIVersion)
		case len(p.MatchImages) == 0 || len(p.MatchImages) > MaxMatchImages:
			return c, fmt.Errorf("provider %s: %d matchImages, want 1 to %d", p.Name, len(p.MatchImages), MaxMatchImages)
		}
	}
	return c, nil
}

// ProviderKeychain answers for the images its plugins match by running them; other images are
// anonymous. Responses are cached in memory for their cacheDuration (one worker run).
type ProviderKeychain struct {
	cfg    CredentialProviderConfig
	binDir string
	// timeout bounds one plugin run (ProviderTimeout).
	timeout time.Duration
	now     func() time.Time
	mu      sync.Mutex
	cache   map[string]cachedAuth
}

type cachedAuth struct {
	auth    map[string]providerAuth
	expires time.Time
}

// LoadCredentialProviders reads the config file (at most MaxConfigBytes) and returns a keychain
// running the plugins of binDir.
func LoadCredentialProviders(configFile, binDir string) (*ProviderKeychain, error) {
	data, err := readBounded(configFile, MaxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("reading the credential provider config: %w", err)
	}
	cfg, err := ParseCredentialProviderConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", configFile, err)
	}
	return &ProviderKeychain{cfg: cfg, binDir: binDir, timeout: ProviderTimeout, now: time.Now, cache: map[string]cachedAuth{}}, nil
}

// Resolve implements authn.Keychain.
func (k *ProviderKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), r)
}

// ResolveContext implements authn.ContextKeychain: the first provider whose matchImages match the
// repository (host/path) and whose response has an auth entry matching it gives the credentials.
func (k *ProviderKeychain) ResolveContext(ctx context.Context, r authn.Resource) (authn.Authenticator, error) {
	image := r.String()
	for _, p := range k.cfg.Providers {
		if !matchAny(p.MatchImages, image) {
			continue
		}
		auth, err := k.authFor(ctx, p, image)
		if err != nil {
			return nil, err
		}
		if a, ok := bestAuth(auth, image); ok {
			return authn.FromConfig(authn.AuthConfig{Username: a.Username, Password: a.Password}), nil
		}
	}
	return authn.Anonymous, nil
}

// authFor returns the provider's auth map for image, from the cache or by running the plugin.
func (k *ProviderKeychain) authFor(ctx context.Context, p CredentialProvider, image string) (map[string]providerAuth, error) {
	host, _, _ := strings.Cut(image, "/")
	k.mu.Lock()
	for _, key := range []string{p.Name + "\x00image\x00" + image, p.Name + "\x00registry\x00" + host, p.Name + "\x00global"} {
		if c, ok := k.cache[key]; ok && k.now().Before(c.expires) {
			k.mu.Unlock()
			return c.auth, nil
		}
	}
	k.mu.Unlock()
	resp, err := k.exec(ctx, p, image)
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(0)
	if p.DefaultCacheDuration != nil {
		ttl = p.DefaultCacheDuration.Duration
	}
	if resp.CacheDuration != nil {
		ttl = resp.CacheDuration.Duration
	}
	if ttl > 0 {
		key := map[string]string{"Image": p.Name + "\x00image\x00" + image, "Registry": p.Name + "\x00registry\x00" + host, "Global": p.Name + "\x00global"}[resp.CacheKeyType]
		k.mu.Lock()
		k.cache[key] = cachedAuth{auth: resp.Auth, expires: k.now().Add(ttl)}
		k.mu.Unlock()
	}
	return resp.Auth, nil
}

// exec runs the plugin with the request on its standard input, bounded in time and output.
func (k *ProviderKeychain) exec(ctx context.Context, p CredentialProvider, image string) (providerResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	req, err := json.Marshal(providerRequest{APIVersion: ProviderAPIVersion, Kind: requestKind, Image: image})
	if err != nil {
		return providerResponse{}, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(k.binDir, p.Name), p.Args...) // #nosec G204 -- the node's own credential provider configuration names the plugin
	cmd.Env = os.Environ()
	for _, e := range p.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Stdin = bytes.NewReader(req)
	stdout := &capped{max: MaxProviderResponse}
	stderr := &capped{max: maxProviderStderr, keepTail: true}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	switch {
	case ctx.Err() != nil:
		return providerResponse{}, fmt.Errorf("credential provider %s: no answer within %s", p.Name, k.timeout)
	case err != nil:
		return providerResponse{}, fmt.Errorf("credential provider %s: %w: %s", p.Name, err, strings.TrimSpace(stderr.buf.String()))
	case stdout.over:
		return providerResponse{}, fmt.Errorf("credential provider %s: response larger than %d bytes", p.Name, MaxProviderResponse)
	}
	var resp providerResponse
	if err := json.Unmarshal(stdout.buf.Bytes(), &resp); err != nil {
		return providerResponse{}, fmt.Errorf("credential provider %s: malformed response: %w", p.Name, err)
	}
	if resp.APIVersion != ProviderAPIVersion || resp.Kind != responseKind {
		return providerResponse{}, fmt.Errorf("credential provider %s: response is %s %s, want %s %s", p.Name, resp.APIVersion, resp.Kind, ProviderAPIVersion, responseKind)
	}
	switch resp.CacheKeyType {
	case "Image", "Registry", "Global":
	default:
		return providerResponse{}, fmt.Errorf("credential provider %s: cacheKeyType %q, want Image, Registry or Global", p.Name, resp.CacheKeyType)
	}
	return resp, nil
}

// capped is a writer that keeps at most max bytes: the head (and notes it was cut), or the tail.
type capped struct {
	buf      bytes.Buffer
	max      int
	over     bool
	keepTail bool
}

func (c *capped) Write(p []byte) (int, error) {
	n := len(p)
	if c.keepTail {
		c.buf.Write(p)
		if extra := c.buf.Len() - c.max; extra > 0 {
			c.buf.Next(extra)
		}
		return n, nil
	}
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		p = p[:max(room, 0)]
	}
	c.buf.Write(p)
	return n, nil
}

var _ io.Writer = (*capped)(nil)

// bestAuth picks the auth entry whose key matches image the most specifically (the longest key).
func bestAuth(auth map[string]providerAuth, image string) (providerAuth, bool) {
	var best providerAuth
	bestLen := -1
	for key, a := range auth {
		if URLMatch(key, image) && len(key) > bestLen {
			best, bestLen = a, len(key)
		}
	}
	return best, bestLen >= 0
}

func matchAny(globs []string, image string) bool {
	for _, g := range globs {
		if URLMatch(g, image) {
			return true
		}
	}
	return false
}

// URLMatch reports whether image (host[:port]/path) matches the kubelet matchImages pattern glob:
// the same number of host labels, each matched as a glob (so *.example.com matches
// a.example.com, not example.com nor a.b.example.com), the same port, and the pattern's path a
// prefix of the image's path.
func URLMatch(glob, image string) bool {
	g, err1 := parseImageURL(glob)
	t, err2 := parseImageURL(image)
	if err1 != nil || err2 != nil {
		return false
	}
	gl, tl := strings.Split(g.Hostname(), "."), strings.Split(t.Hostname(), ".")
	if len(gl) != len(tl) || g.Port() != t.Port() {
		return false
	}
	for i := range gl {
		if ok, err := path.Match(gl[i], tl[i]); err != nil || !ok {
			return false
		}
	}
	return strings.HasPrefix(t.Path, g.Path)
}

func parseImageURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err == nil && u.Host == "" {
		err = errors.New("no host")
	}
	return u, err
}
