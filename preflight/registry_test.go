package preflight

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/test/ocireg"
)

type basicKeychain struct{ user, pass string }

func (k basicKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return &authn.Basic{Username: k.user, Password: k.pass}, nil
}

// TestRegistryCheck asks go-containerregistry's in-process registry, public and behind basic auth,
// and checks each outcome.
func TestRegistryCheck(t *testing.T) {
	public := ocireg.Start(t, ocireg.Options{})
	private := ocireg.Start(t, ocireg.Options{User: "kmm", Password: "s3cret"})
	secure := ocireg.Start(t, ocireg.Options{TLS: true})
	served := public.Push(t, "kmod/nic:6.1")
	index := public.PushIndex(t, "kmod/multi:6.1", v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "linux", Architecture: "arm64"})
	privateImg := private.Push(t, "kmod/secret:6.1")
	secureImg := secure.Push(t, "kmod/tls:6.1")
	closed := ocireg.Start(t, ocireg.Options{})
	closed.Server.Close()

	insecure := kmmv1beta1.TLSOptions{Insecure: true}
	amd64, s390x := v1.Platform{OS: "linux", Architecture: "amd64"}, v1.Platform{OS: "linux", Architecture: "s390x"}
	cases := []struct {
		name      string
		target    Target
		kc        authn.Keychain
		platforms []v1.Platform
		want      Outcome
		detail    string
	}{
		{"served image", Target{Image: served, RegistryTLS: insecure}, authn.DefaultKeychain, nil, Found, ""},
		{"missing tag", Target{Image: public.Host + "/kmod/nic:6.2", RegistryTLS: insecure}, authn.DefaultKeychain, nil, NotFound, ""},
		{"missing repository", Target{Image: public.Host + "/kmod/none:6.1", RegistryTLS: insecure}, authn.DefaultKeychain, nil, NotFound, ""},
		{"index with the nodes' platform", Target{Image: index, RegistryTLS: insecure}, authn.DefaultKeychain, []v1.Platform{amd64}, Found, ""},
		{"index without the nodes' platform", Target{Image: index, RegistryTLS: insecure}, authn.DefaultKeychain, []v1.Platform{amd64, s390x}, NotFound, "linux/s390x"},
		{"private, right credentials", Target{Image: privateImg, RegistryTLS: insecure}, basicKeychain{"kmm", "s3cret"}, nil, Found, ""},
		{"private, wrong credentials", Target{Image: privateImg, RegistryTLS: insecure}, basicKeychain{"kmm", "wrong"}, nil, Denied, ""},
		{"private, no credentials", Target{Image: privateImg, RegistryTLS: insecure}, authn.DefaultKeychain, nil, Denied, ""},
		{"registry down", Target{Image: closed.Host + "/kmod/nic:6.1", RegistryTLS: insecure}, authn.DefaultKeychain, nil, Unreachable, ""},
		{"TLS with an untrusted certificate and insecureSkipTLSVerify", Target{Image: secureImg, RegistryTLS: kmmv1beta1.TLSOptions{InsecureSkipTLSVerify: true}}, authn.DefaultKeychain, nil, Found, ""},
		{"TLS with an untrusted certificate, verified", Target{Image: secureImg}, authn.DefaultKeychain, nil, Unreachable, "certificate"},
	}
	reg := Registry{Timeout: 10 * time.Second}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := reg.Check(context.Background(), c.target, c.kc, c.platforms)
			if got.Outcome != c.want || !strings.Contains(got.Detail, c.detail) {
				t.Fatalf("Check = %+v, want %s with %q", got, c.want, c.detail)
			}
			if got.Outcome == Found && !strings.HasPrefix(got.Digest, "sha256:") {
				t.Fatalf("found without a digest: %+v", got)
			}
		})
	}
}

// TestRegistryCheckTimeout: a registry that accepts the connection and never answers is cut at the
// check's timeout and reported Unreachable.
func TestRegistryCheckTimeout(t *testing.T) {
	stall := ocireg.StartStalled(t)
	start := time.Now()
	got := Registry{Timeout: 300 * time.Millisecond}.Check(context.Background(),
		Target{Image: stall + "/kmod/nic:6.1", RegistryTLS: kmmv1beta1.TLSOptions{Insecure: true}}, authn.DefaultKeychain, nil)
	if got.Outcome != Unreachable || time.Since(start) > 5*time.Second {
		t.Fatalf("Check = %+v after %v, want Unreachable within the timeout", got, time.Since(start))
	}
}
