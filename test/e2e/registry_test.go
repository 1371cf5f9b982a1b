package e2e

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// TestReadLayout checks what PushLayout pushes: the image of a one-image layout, the inner index of a
// layout holding one index (a multi-platform image), the whole index otherwise.
func TestReadLayout(t *testing.T) {
	img := func() v1.Image {
		i, err := random.Image(64, 1)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	one := img()
	inner := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: img()}, mutate.IndexAddendum{Add: img()})
	for name, tc := range map[string]struct {
		index     v1.ImageIndex
		wantImage v1.Image
		wantIndex v1.ImageIndex
	}{
		"one image":  {index: mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: one}), wantImage: one},
		"one index":  {index: mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: inner}), wantIndex: inner},
		"two images": {index: inner, wantIndex: inner},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := layout.Write(dir, tc.index); err != nil {
				t.Fatal(err)
			}
			gotImage, gotIndex, err := readLayout(dir)
			if err != nil {
				t.Fatal(err)
			}
			if (gotImage == nil) != (tc.wantImage == nil) || (gotIndex == nil) != (tc.wantIndex == nil) {
				t.Fatalf("readLayout = image %v, index %v; want image %v, index %v", gotImage != nil, gotIndex != nil, tc.wantImage != nil, tc.wantIndex != nil)
			}
			if tc.wantImage != nil && digest(t, gotImage) != digest(t, tc.wantImage) {
				t.Errorf("image %s, want %s", digest(t, gotImage), digest(t, tc.wantImage))
			}
			if tc.wantIndex != nil && digest(t, gotIndex) != digest(t, tc.wantIndex) {
				t.Errorf("index %s, want %s", digest(t, gotIndex), digest(t, tc.wantIndex))
			}
		})
	}
	if _, _, err := readLayout(t.TempDir()); err == nil {
		t.Error("readLayout of an empty folder: no error")
	}
}

func digest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// TestPrivateRepositories: a request for a repository under PrivatePrefix without the credentials
// is refused with a Basic challenge (which BuildKit, containerd and go-containerregistry answer
// with a Module's pull secret); with them, and for the other repositories, the registry answers.
func TestPrivateRepositories(t *testing.T) {
	srv := httptest.NewServer(privateRepositories(registry.New(registry.Logger(log.New(io.Discard, "", 0)))))
	defer srv.Close()
	head := func(path string, auth bool) *http.Response {
		req, err := http.NewRequest(http.MethodHead, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth {
			req.SetBasicAuth(PrivateUser, PrivatePassword)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	if r := head("/v2/"+PrivatePrefix+"kmod/manifests/v1", false); r.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("anonymous request for a private repository: %s, challenge %q; want 401 with a Basic challenge", r.Status, r.Header.Get("WWW-Authenticate"))
	}
	if r := head("/v2/"+PrivatePrefix+"kmod/manifests/v1", true); r.StatusCode != http.StatusNotFound {
		t.Errorf("authenticated request for a missing private image: %s, want 404 from the registry", r.Status)
	}
	if r := head("/v2/kmm-e2e/kmod/manifests/v1", false); r.StatusCode != http.StatusNotFound {
		t.Errorf("anonymous request for a public repository: %s, want 404 from the registry", r.Status)
	}
}
