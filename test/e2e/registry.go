package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The registry's private repositories: those under PrivatePrefix answer only requests carrying
// PrivateUser:PrivatePassword (HTTP basic authentication), the others anyone. Nothing the node's
// containerd pulls lives there; kmm's build, sign and worker pods reach it with a Module's
// imageRepoSecret.
const (
	PrivatePrefix   = "private/"
	PrivateUser     = "kmm-e2e"
	PrivatePassword = "e2e-registry-password" //nolint:gosec // G101: the test registry's own password
)

// imageRegistry is an in-process OCI registry (go-containerregistry's) on 127.0.0.1 and on the
// node IP, same port: containerd pulls from either; a pod outside the host network reaches only
// the node IP. Its repositories under PrivatePrefix need credentials (privateRepositories).
type imageRegistry struct {
	server *http.Server
	port   int
	log    *os.File
}

func startRegistry(logDir, nodeIP string) (*imageRegistry, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	ln, err := net.Listen("tcp", net.JoinHostPort(nodeIP, fmt.Sprint(port)))
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("registry on the node IP: %w", err)
	}
	logf, err := os.Create(filepath.Join(logDir, "registry.log"))
	if err != nil {
		_, _ = l.Close(), ln.Close()
		return nil, err
	}
	r := &imageRegistry{port: port, log: logf, server: &http.Server{
		Handler:           privateRepositories(registry.New(registry.Logger(log.New(logf, "", log.LstdFlags)))),
		ReadHeaderTimeout: 10 * time.Second,
	}}
	for _, lis := range []net.Listener{l, ln} {
		go func() { _ = r.server.Serve(lis) }()
	}
	return r, nil
}

// privateRepositories answers 401 with a Basic challenge to a request for a repository under
// PrivatePrefix that lacks PrivateUser:PrivatePassword; everything else goes to next.
func privateRepositories(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v2/"+PrivatePrefix) {
			if u, p, ok := r.BasicAuth(); !ok || u != PrivateUser || p != PrivatePassword {
				w.Header().Set("WWW-Authenticate", `Basic realm="kmm-e2e"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// PrivateAuth is the credential of the registry's private repositories.
func PrivateAuth() authn.Authenticator {
	return &authn.Basic{Username: PrivateUser, Password: PrivatePassword}
}

func (r *imageRegistry) stop() error {
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(r.server.Shutdown(ctx), r.log.Close())
}

// push writes img, or an image index, to the registry under repoTag ("kmm/worker:e2e") through
// 127.0.0.1 and returns the full reference.
func (r *imageRegistry) push(repoTag string, img v1.Image, index v1.ImageIndex) (string, error) {
	full := fmt.Sprintf("127.0.0.1:%d/%s", r.port, repoTag)
	ref, err := name.ParseReference(full, name.Insecure)
	if err != nil {
		return "", err
	}
	auth := remote.WithAuth(PrivateAuth()) // the private repositories' credentials; the others ignore them
	if index != nil {
		err = remote.WriteIndex(ref, index, auth)
	} else {
		err = remote.Write(ref, img, auth)
	}
	if err != nil {
		return "", fmt.Errorf("pushing %s: %w", full, err)
	}
	return full, nil
}

// BinaryImage is a FROM-scratch image holding one static binary as its entrypoint (/<base name>),
// for linux on this machine's architecture.
func BinaryImage(binary string, args ...string) (v1.Image, error) {
	data, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	base := filepath.Base(binary)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: base, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layerImage(buf.Bytes(), func(c *v1.Config) {
		c.Entrypoint = []string{"/" + base}
		c.Cmd = args
	})
}

// layerImage is an image of one layer, the tar in data, for this machine's platform (containerd
// matches a single manifest's platform against its own: an empty one does not match); edit, when
// not nil, changes its config; opts tune the layer (compression).
func layerImage(data []byte, edit func(*v1.Config), opts ...tarball.LayerOption) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, opts...)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if edit != nil {
		edit(&cf.Config)
	}
	return mutate.ConfigFile(img, cf)
}

// GoBinaryImage builds the main package pkg (an import path of this module) as a static binary
// into dir and returns BinaryImage of it.
func GoBinaryImage(ctx context.Context, dir, pkg string) (v1.Image, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg) //nolint:gosec // G204: go build of our own package
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return BinaryImage(out)
}

// readLayout reads the OCI layout at path: its one image, or its index when it holds several
// manifests or a nested index.
func readLayout(path string) (v1.Image, v1.ImageIndex, error) {
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return nil, nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, err
	}
	if len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsImage() {
		img, err := idx.Image(m.Manifests[0].Digest)
		return img, nil, err
	}
	if len(m.Manifests) == 1 && m.Manifests[0].MediaType.IsIndex() {
		inner, err := idx.ImageIndex(m.Manifests[0].Digest)
		return nil, inner, err
	}
	if len(m.Manifests) == 0 {
		return nil, nil, fmt.Errorf("OCI layout %s holds no manifest", path)
	}
	return nil, idx, nil
}
