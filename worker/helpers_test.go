package worker

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// testKernel is the kernel version the test kmod images are built for.
const testKernel = "6.1.0-kmmtest"

// requireTool returns the path of a Debian tool, failing the test with the package to install
// when it is missing.
func requireTool(t testing.TB, tool, pkg string) string {
	t.Helper()
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, tool)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath(tool); err == nil {
		return p
	}
	t.Fatalf("%s is missing: install the Debian package %q (apt-get install %s)", tool, pkg, pkg)
	return ""
}

// moduleSources are two tiny kernel-module-like objects: kmm_test_a uses a symbol that kmm_test_b
// exports (listed in __ksymtab_strings, which depmod reads), so depmod makes a depend on b.
var moduleSources = map[string]string{
	"kmm_test_b": `int kmm_test_b_fn(void) { return 1; }
static const char kstr[] __attribute__((section("__ksymtab_strings"), used, aligned(1))) = "kmm_test_b_fn";
` + modinfo("kmm_test_b"),
	"kmm_test_a": `extern int kmm_test_b_fn(void);
int kmm_test_a_fn(void) { return kmm_test_b_fn() + 1; }
` + modinfo("kmm_test_a"),
	"kmm_test_c": `int kmm_test_c_fn(void) { return 3; }
` + modinfo("kmm_test_c"),
}

func modinfo(mod string) string {
	var b strings.Builder
	for i, kv := range []string{"name=" + mod, "vermagic=" + testKernel + " SMP mod_unload ", "license=GPL", "depends="} {
		b.WriteString(`static const char mi` + string(rune('0'+i)) + `[] __attribute__((section(".modinfo"), used, aligned(1))) = "` + kv + "\";\n")
	}
	return b.String()
}

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  string
)

// moduleTree returns a directory holding lib/modules/<testKernel> with real ELF .ko files built by
// gcc and depmod's output, built once per test binary.
func moduleTree(t testing.TB) string {
	t.Helper()
	gcc := requireTool(t, "gcc", "gcc")
	depmod := requireTool(t, "depmod", "kmod")
	fixtureOnce.Do(func() { fixtureDir, fixtureErr = buildModuleTree(gcc, depmod) })
	if fixtureErr != "" {
		t.Fatal(fixtureErr)
	}
	return fixtureDir
}

func buildModuleTree(gcc, depmod string) (string, string) {
	dir, err := os.MkdirTemp("", "kmm-worker-fixture-")
	if err != nil {
		return "", err.Error()
	}
	extra := filepath.Join(dir, "lib/modules", testKernel, "extra")
	if err := os.MkdirAll(extra, 0o755); err != nil {
		return "", err.Error()
	}
	for mod, src := range moduleSources {
		c := filepath.Join(dir, mod+".c")
		if err := os.WriteFile(c, []byte(src), 0o600); err != nil {
			return "", err.Error()
		}
		if out, err := exec.Command(gcc, "-c", "-O0", "-o", filepath.Join(extra, mod+".ko"), c).CombinedOutput(); err != nil {
			return "", "gcc: " + err.Error() + ": " + string(out)
		}
		_ = os.Remove(c)
	}
	if out, err := exec.Command(depmod, "-b", dir, testKernel).CombinedOutput(); err != nil {
		return "", "depmod: " + err.Error() + ": " + string(out)
	}
	dep, err := os.ReadFile(filepath.Join(dir, "lib/modules", testKernel, "modules.dep"))
	if err != nil || !strings.Contains(string(dep), "extra/kmm_test_a.ko: extra/kmm_test_b.ko") {
		return "", "depmod did not record that kmm_test_a depends on kmm_test_b: " + string(dep)
	}
	return dir, ""
}

// entry is one archive entry of a test layer.
type entry struct {
	Name     string
	Body     string
	Type     byte
	Linkname string
}

func file(name, body string) entry { return entry{Name: name, Body: body, Type: tar.TypeReg} }
func dir(name string) entry        { return entry{Name: name, Type: tar.TypeDir} }

// tarBytes writes entries as a tar archive.
func tarBytes(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Linkname: e.Linkname, Mode: 0o644, Size: int64(len(e.Body))}
		if e.Type == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if e.Type != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.Type == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer returns a gzip-compressed layer of entries.
func layer(t testing.TB, entries []entry) v1.Layer {
	t.Helper()
	data := tarBytes(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// image builds an image FROM scratch: one layer per element of layers.
func image(t testing.TB, layers ...[]entry) v1.Image {
	t.Helper()
	ls := make([]v1.Layer, 0, len(layers))
	for _, es := range layers {
		ls = append(ls, layer(t, es))
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// treeEntries returns the files of the directory src as entries under the archive directory prefix.
func treeEntries(t testing.TB, src, prefix string) []entry {
	t.Helper()
	var out []entry
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := path.Join(prefix, filepath.ToSlash(rel))
		if d.IsDir() {
			out = append(out, dir(name+"/"))
			return nil
		}
		data, err := os.ReadFile(p)
		out = append(out, file(name, string(data)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kmodEntries is a kmod image's content: the test module tree under dirName (e.g. "opt").
func kmodEntries(t testing.TB, dirName string) []entry {
	t.Helper()
	return treeEntries(t, filepath.Join(moduleTree(t), "lib"), path.Join(dirName, "lib"))
}

// testRegistry is go-containerregistry's in-process registry on loopback, counting requests and
// optionally behind basic auth.
type testRegistry struct {
	srv      *httptest.Server
	host     string
	requests atomic.Int64
	blobGets atomic.Int64
	user     string
	password string
}

type registryOpts struct {
	tls            bool
	user, password string
	// intercept, when set, sees every request first; it returns true when it answered it.
	intercept func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool
}

func newTestRegistry(t testing.TB, o registryOpts) *testRegistry {
	t.Helper()
	r := startRegistry(o)
	t.Cleanup(r.srv.Close)
	return r
}

// startRegistry starts a registry that lives until the test binary exits.
func startRegistry(o registryOpts) *testRegistry {
	r := &testRegistry{user: o.user, password: o.password}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
			r.blobGets.Add(1)
		}
		if r.user != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != r.user || p != r.password {
				w.Header().Set("WWW-Authenticate", `Basic realm="kmm-test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if o.intercept != nil && o.intercept(w, req, inner) {
			return
		}
		inner.ServeHTTP(w, req)
	})
	if o.tls {
		r.srv = httptest.NewTLSServer(h)
	} else {
		r.srv = httptest.NewServer(h)
	}
	r.host = strings.TrimPrefix(strings.TrimPrefix(r.srv.URL, "http://"), "https://")
	return r
}

// push uploads img as repo:tag and returns the tag reference and the image digest; the request
// counter starts from zero afterwards.
func (r *testRegistry) push(t testing.TB, repo string, img v1.Image) (string, v1.Hash) {
	t.Helper()
	ref := r.host + "/" + repo
	tag, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	opts := []remote.Option{remote.WithTransport(r.srv.Client().Transport)}
	if r.user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: r.user, Password: r.password}))
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	r.requests.Store(0)
	r.blobGets.Store(0)
	return ref, d
}

// sandbox is a host root with a boot ID, a cache and a place for temporary files.
type sandbox struct {
	root, cache, tmp string
}

const testBootID = "3f1c9a52-0d4e-4f6b-9a51-2b9d1c1e7a10"

func newSandbox(t testing.TB) sandbox {
	t.Helper()
	base := t.TempDir()
	s := sandbox{root: filepath.Join(base, "host"), cache: filepath.Join(base, "cache"), tmp: filepath.Join(base, "tmp")}
	for _, d := range []string{s.root + "/proc/sys/kernel/random", s.cache, s.tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(s.root+"/proc/sys/kernel/random/boot_id", []byte(testBootID+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// recorder is a Modprobe that records command lines and runs the real modprobe (dry-run lines only).
type recorder struct {
	t     testing.TB
	mu    sync.Mutex
	calls [][]string
	real  Modprobe
	// stdout collects what the real modprobe printed.
	stdout strings.Builder
	// softdep is the content of the -C file seen during the last call.
	softdep string
}

func newRecorder(t testing.TB) *recorder {
	return &recorder{t: t, real: ExecModprobe{Path: requireTool(t, "modprobe", "kmod")}}
}

func (r *recorder) Run(ctx context.Context, args []string) ([]byte, []byte, error) {
	r.mu.Lock()
	r.calls = append(r.calls, append([]string(nil), args...))
	for i, a := range args {
		if a == "-C" && i+1 < len(args) {
			data, _ := os.ReadFile(args[i+1])
			r.softdep = string(data)
		}
	}
	r.mu.Unlock()
	if len(args) == 0 || args[0] != "-n" {
		r.t.Errorf("refusing to run a modprobe command line that is not a dry run: %q", args)
		return nil, nil, io.ErrUnexpectedEOF
	}
	out, errOut, err := r.real.Run(ctx, args)
	r.mu.Lock()
	r.stdout.Write(out)
	r.mu.Unlock()
	return out, errOut, err
}

// newTestWorker returns a dry-run worker on sandbox s with modprobe m.
func newTestWorker(t testing.TB, s sandbox, m Modprobe, mutate ...func(*Options)) *Worker {
	t.Helper()
	o := Options{CacheDir: s.cache, DryRun: true, Modprobe: m, Host: NewSandboxHost(s.root), TempDir: s.tmp}
	for _, f := range mutate {
		f(&o)
	}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// testConfig is a load config of kmm_test_a from image.
func testConfig(image string) contract.Config {
	return contract.Config{
		Namespace: "default",
		Name:      "kmm-test",
		Config: kmmv1beta1.ModuleConfig{
			KernelVersion:  testKernel,
			ContainerImage: image,
			Modprobe:       kmmv1beta1.ModprobeSpec{ModuleName: "kmm_test_a", DirName: "/opt"},
		},
	}
}

// listFiles returns the relative paths of everything below dir.
func listFiles(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && p != dir {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

func mustRegistry(t testing.TB, host string) name.Registry {
	t.Helper()
	r, err := name.NewRegistry(host)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// innerBody returns what the inner registry answers to a GET of the request's URL.
func innerBody(inner http.Handler, r *http.Request) []byte {
	rec := httptest.NewRecorder()
	inner.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, r.URL.String(), nil))
	return rec.Body.Bytes()
}

// serveChunked writes body without a Content-Length (chunked), as a registry streaming a blob does.
func serveChunked(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// isBlob reports whether r fetches the blob d.
func isBlob(r *http.Request, d v1.Hash) bool {
	return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+d.String())
}

// layerDigest returns the digest of layer i of img.
func layerDigest(t testing.TB, img v1.Image, i int) v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ls[i].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// compressedBytes returns the compressed bytes of a layer.
func compressedBytes(t testing.TB, l v1.Layer) []byte {
	t.Helper()
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close() //nolint:errcheck // test
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// loads returns the modprobe calls that were not --show-depends checks.
func (r *recorder) loads() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]string
	for _, c := range r.calls {
		if !slices.Contains(c, "--show-depends") {
			out = append(out, c)
		}
	}
	return out
}

// assertNothingLoaded checks that a failed run ran no load (only --show-depends checks, if any),
// left no cache entry, and changed nothing on the host but the boot ID.
func assertNothingLoaded(t *testing.T, s sandbox, m *recorder) {
	t.Helper()
	if l := m.loads(); len(l) != 0 {
		t.Errorf("modprobe ran: %q", l)
	}
	if got := listFiles(t, s.root); strings.Join(got, ",") != "proc,proc/sys,proc/sys/kernel,proc/sys/kernel/random,proc/sys/kernel/random/boot_id" {
		t.Errorf("the host root changed: %v", got)
	}
}
