package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestReproducible assembles the images a second time from the same binaries and packages and
// checks that every digest is the same, and that the two OCI layouts are identical byte for byte.
func TestReproducible(t *testing.T) {
	bins, first := testImages(t)
	unlock, err := lockDir(testDebian(t).Dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := assemble(context.Background(), assembleOptions{Platforms: testPlatforms, Binaries: bins, Debian: testDebian(t), Epoch: testEpoch})
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		one, want v1.ImageIndex
	}{{managerName, second.Manager, first.Manager}, {workerName, second.Worker, first.Worker}} {
		if diff := diffLines(digests(t, c.want), digests(t, c.one)); diff != "" {
			t.Errorf("%s: digests of the second build differ (-first +second):\n%s", c.name, diff)
		}
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	for i, set := range []*imageSet{first, second} {
		if _, err := set.writeLayouts(dirs[i], "dev"); err != nil {
			t.Fatal(err)
		}
	}
	if diff := diffLines(mapLines(treeHashes(t, dirs[0])), mapLines(treeHashes(t, dirs[1]))); diff != "" {
		t.Errorf("the OCI layouts of two builds differ (-first +second):\n%s", diff)
	}
	t.Logf("layouts: %v", treeSizes(t, dirs[0]))
}

// digests lists the index digest and, per platform, the manifest, config and layer digests.
func digests(t *testing.T, idx v1.ImageIndex) []string {
	t.Helper()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"index " + d.String()}
	for _, p := range testPlatforms {
		img := platformImage(t, idx, p)
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		md, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p.String()+" manifest "+md.String(), p.String()+" config "+m.Config.Digest.String())
		for i, l := range m.Layers {
			out = append(out, fmt.Sprintf("%s layer %d %s", p, i, l.Digest))
		}
	}
	return out
}

// treeHashes returns the SHA-256 of every file under dir, by relative path.
func treeHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p) // #nosec G304 -- the test's own files
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%x", sha256.Sum256(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// treeSizes returns the total size of each directory under dir, in MiB.
func treeSizes(t *testing.T, dir string) map[string]string {
	t.Helper()
	sizes := map[string]int64{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		top, _, _ := strings.Cut(rel, string(filepath.Separator))
		sizes[top] += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range sizes {
		out[k] = fmt.Sprintf("%.1f MiB", float64(v)/(1<<20))
	}
	return out
}

// checkEntries checks what every image entry shares: owner 0:0, the build time, fixed modes.
func checkEntries(t *testing.T, label string, files map[string]entry) {
	t.Helper()
	for p, e := range files {
		want := map[byte]int64{tar.TypeDir: 0o755, tar.TypeSymlink: 0o777, tar.TypeReg: 0o644}[e.Type]
		if e.Type == tar.TypeReg && e.Mode == 0o755 {
			want = 0o755 // an executable
		}
		if e.UID != 0 || e.GID != 0 || !e.Time.Equal(testEpoch) || e.Mode != want {
			t.Errorf("%s: /%s: owner %d:%d, time %s, mode %o; want 0:0, %s, %o", label, p, e.UID, e.GID, e.Time, e.Mode, testEpoch, want)
		}
	}
}

// TestManagerImage lists the operator image: /manager and the CA bundle (and their directories),
// user 65532:65532, entrypoint /manager, for every platform.
func TestManagerImage(t *testing.T) {
	bins, set := testImages(t)
	checkIndex(t, set.Manager)
	for _, p := range testPlatforms {
		img := platformImage(t, set.Manager, p)
		files := imageFiles(t, img)
		want := []string{"etc", "etc/ssl", "etc/ssl/certs", "etc/ssl/certs/ca-certificates.crt", "manager"}
		if diff := diffLines(want, sortedKeys(files)); diff != "" {
			t.Errorf("%s: files of the manager image (-want +got):\n%s", p, diff)
		}
		checkEntries(t, p.String(), files)
		if files["manager"].Mode != 0o755 {
			t.Errorf("%s: /manager mode %o, want 755", p, files["manager"].Mode)
		}
		built, err := os.ReadFile(bins[p.String()].Manager)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(files["manager"].Data, built) {
			t.Errorf("%s: /manager is not the binary built for the platform", p)
		}
		checkCABundle(t, files["etc/ssl/certs/ca-certificates.crt"].Data)
		checkConfig(t, img, p, v1.Config{User: "65532:65532", Entrypoint: []string{"/manager"}, Env: []string{defaultPath}})
	}
}

// TestWorkerImage lists the worker image: the worker binary and exactly the Debian files
// worker-files.txt names, with modprobe and depmod linking to kmod; no shell, no package manager.
func TestWorkerImage(t *testing.T) {
	bins, set := testImages(t)
	checkIndex(t, set.Worker)
	list := readWorkerList(t, filepath.Join(repoRoot, "hack", "images", "worker-files.txt"))
	for _, p := range testPlatforms {
		img := platformImage(t, set.Worker, p)
		files := imageFiles(t, img)
		checkEntries(t, p.String(), files)
		patterns := append(list.forArch(p.GOARCH), "/"+workerPath)
		for _, problem := range matchFiles(patterns, nonDirs(files)) {
			t.Errorf("%s: %s", p, problem)
		}
		for _, forbidden := range []string{"bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/dash", "usr/bin/apt-get", "usr/bin/dpkg", "usr/bin/busybox", "var/lib/dpkg"} {
			if _, ok := files[forbidden]; ok {
				t.Errorf("%s: the worker image has /%s", p, forbidden)
			}
		}
		for _, link := range []string{"usr/sbin/modprobe", "usr/sbin/depmod"} {
			if e := files[link]; e.Type != tar.TypeSymlink || e.Link != "/bin/kmod" {
				t.Errorf("%s: /%s is %c -> %q, want a link to /bin/kmod as Debian ships it", p, link, e.Type, e.Link)
			}
		}
		if e := files["bin"]; e.Type != tar.TypeSymlink || e.Link != "usr/bin" {
			t.Errorf("%s: /bin is %c -> %q, want the merged-/usr link to usr/bin", p, e.Type, e.Link)
		}
		built, err := os.ReadFile(bins[p.String()].Worker)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(files[workerPath].Data, built) || files[workerPath].Mode != 0o755 {
			t.Errorf("%s: /%s is not the executable worker built for the platform", p, workerPath)
		}
		kmod, err := elf.NewFile(bytes.NewReader(files["usr/bin/kmod"].Data))
		if err != nil {
			t.Fatalf("%s: /usr/bin/kmod: %v", p, err)
		}
		if kmod.Machine != p.Machine {
			t.Errorf("%s: /usr/bin/kmod is for %s", p, kmod.Machine)
		}
		checkCABundle(t, files[caBundlePath].Data)
		checkConfig(t, img, p, v1.Config{Entrypoint: []string{"/" + workerPath}, Env: []string{defaultPath}})
	}
}

// checkIndex checks the index: OCI media types, one image per test platform in order.
func checkIndex(t *testing.T, idx v1.ImageIndex) {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s", im.MediaType)
	}
	var got []string
	for _, d := range im.Manifests {
		if d.MediaType != types.OCIManifestSchema1 {
			t.Errorf("manifest media type %s", d.MediaType)
		}
		got = append(got, d.Platform.String())
	}
	if diff := diffLines([]string{"linux/amd64", "linux/arm64/v8"}, got); diff != "" {
		t.Errorf("platforms of the index (-want +got):\n%s", diff)
	}
}

// checkConfig checks the image config: platform, build time and the container config.
func checkConfig(t *testing.T, img v1.Image, p platform, want v1.Config) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Architecture != p.GOARCH || cf.OS != "linux" || cf.Variant != p.Variant || !cf.Created.Equal(testEpoch) {
		t.Errorf("%s: config says %s/%s/%s created %s", p, cf.OS, cf.Architecture, cf.Variant, cf.Created)
	}
	if !reflect.DeepEqual(want, cf.Config) {
		t.Errorf("%s: container config %+v, want %+v", p, cf.Config, want)
	}
	for _, h := range cf.History {
		if !h.Created.Equal(testEpoch) {
			t.Errorf("%s: history entry %q created %s", p, h.CreatedBy, h.Created)
		}
	}
}

// checkCABundle checks that the bundle holds Debian's CA certificates.
func checkCABundle(t *testing.T, data []byte) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) || bytes.Count(data, []byte("-----BEGIN CERTIFICATE-----")) < 100 {
		t.Errorf("the CA bundle (%d bytes) does not hold Debian's CA certificates", len(data))
	}
}

// workerList is worker-files.txt: entries of architecture ("all" or a Debian architecture) and
// path pattern.
type workerList [][2]string

func readWorkerList(t *testing.T, file string) workerList {
	t.Helper()
	data, err := os.ReadFile(file) // #nosec G304 -- the repository's list
	if err != nil {
		t.Fatal(err)
	}
	list, err := parseWorkerList(string(data))
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func parseWorkerList(text string) (workerList, error) {
	var list workerList
	for i, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !path.IsAbs(f[1]) {
			return nil, fmt.Errorf("worker-files.txt:%d: want <arch> <absolute path>, got %q", i+1, line)
		}
		list = append(list, [2]string{f[0], f[1]})
	}
	return list, nil
}

func (l workerList) forArch(arch string) []string {
	var out []string
	for _, e := range l {
		if e[0] == "all" || e[0] == arch {
			out = append(out, e[1])
		}
	}
	return out
}

// matchFiles compares absolute path patterns (path.Match) with image paths (relative): every file
// must match a pattern and every pattern a file. It returns what does not.
func matchFiles(patterns, files []string) []string {
	var problems []string
	used := make([]bool, len(patterns))
	for _, f := range files {
		ok := false
		for i, pat := range patterns {
			if m, _ := path.Match(strings.TrimPrefix(pat, "/"), f); m {
				ok, used[i] = true, true
			}
		}
		if !ok {
			problems = append(problems, "/"+f+" is in the image but not in the list")
		}
	}
	for i, pat := range patterns {
		if !used[i] {
			problems = append(problems, pat+" is in the list but matches nothing in the image")
		}
	}
	return problems
}

// TestModprobeRuns extracts the worker image of this machine's platform and runs its modprobe and
// depmod with the image's own dynamic loader and libraries, after checking with ld.so --list that
// every library resolves inside the image (the loader would otherwise fall back to the host's).
func TestModprobeRuns(t *testing.T) {
	_, set := testImages(t)
	p := hostPlatform(t)
	root := extractImage(t, platformImage(t, set.Worker, p))
	if err := checkLibraries(root, p); err != nil {
		t.Fatal(err)
	}
	for _, prog := range []string{"modprobe", "depmod"} {
		out, err := runInImage(root, p, prog, "--version")
		if err != nil || !strings.Contains(string(out), "kmod version") {
			t.Errorf("%s --version from the image: %v: %s", prog, err, out)
		} else {
			t.Logf("%s --version: %s", prog, strings.SplitN(string(out), "\n", 2)[0])
		}
	}
	// A library missing from the image must be caught, not found on the host.
	lib := filepath.Join(root.dir, "usr/lib", p.Triplet, "libcrypto.so.3")
	if err := os.Remove(lib); err != nil {
		t.Fatal(err)
	}
	if err := checkLibraries(root, p); err == nil {
		t.Error("checkLibraries passed with libcrypto.so.3 removed from the image")
	}
}

// hostPlatform returns this machine's platform, which must be one the images are built for.
func hostPlatform(t *testing.T) platform {
	t.Helper()
	p, ok := knownPlatforms["linux/"+runtime.GOARCH]
	if !ok || runtime.GOOS != "linux" {
		t.Fatalf("this test runs the image's programs and needs a linux/amd64 or linux/arm64 machine, this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	return p
}

// extracted is a worker image written to a directory, with its tree to resolve links inside it.
type extracted struct {
	dir  string
	tree tree
}

func extractImage(t *testing.T, img v1.Image) extracted {
	t.Helper()
	dir := t.TempDir()
	tr := tree{}
	files := imageFiles(t, img)
	for _, p := range sortedKeys(files) {
		e := files[p]
		tr[p] = &node{Type: e.Type, Mode: e.Mode, Link: e.Link, Data: e.Data}
		dst := filepath.Join(dir, p)
		var err error
		switch e.Type {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(e.Link, dst)
		case tar.TypeReg:
			err = os.WriteFile(dst, e.Data, fs.FileMode(e.Mode)) // #nosec G306 G115 -- the image's own modes, in a temporary directory
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return extracted{dir: dir, tree: tr}
}

// loader returns the host path of the image's dynamic loader for kmod, resolved inside the image.
func (x extracted) loader(p platform) (string, error) {
	interp, _, err := dynamic(x.tree["usr/bin/kmod"].Data, p)
	if err != nil {
		return "", err
	}
	key, _, err := x.tree.resolve(interp)
	if err != nil {
		return "", err
	}
	return filepath.Join(x.dir, key), nil
}

// loaderCmd runs the image's kmod through the image's loader, with only the image's library
// directory named and the host's ld.so.cache ignored.
func loaderCmd(x extracted, p platform, args ...string) (*exec.Cmd, error) {
	ld, err := x.loader(p)
	if err != nil {
		return nil, err
	}
	all := append([]string{"--inhibit-cache", "--library-path", filepath.Join(x.dir, "usr/lib", p.Triplet)}, args...)
	cmd := exec.Command(ld, all...) // #nosec G204 -- the loader of the image under test
	cmd.Env = []string{"LC_ALL=C"}
	return cmd, nil
}

// checkLibraries lists kmod's libraries with ld.so --list and fails unless each one resolves
// inside the image.
func checkLibraries(x extracted, p platform) error {
	cmd, err := loaderCmd(x, p, "--list", filepath.Join(x.dir, "usr/bin/kmod"))
	if err != nil {
		return err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ld.so --list: %w: %s", err, out)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		_, target, ok := strings.Cut(line, "=>")
		if !ok {
			continue
		}
		f := strings.Fields(target)
		if len(f) == 0 || !strings.HasPrefix(f[0], x.dir+string(filepath.Separator)) {
			return fmt.Errorf("ld.so --list: %q does not resolve inside the image:\n%s", strings.TrimSpace(line), out)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("ld.so --list named no library:\n%s", out)
	}
	return nil
}

// runInImage runs the image's kmod as prog (kmod picks the tool from argv[0]).
func runInImage(x extracted, p platform, prog string, args ...string) ([]byte, error) {
	cmd, err := loaderCmd(x, p, append([]string{"--argv0", prog, filepath.Join(x.dir, "usr/bin/kmod")}, args...)...)
	if err != nil {
		return nil, err
	}
	return cmd.CombinedOutput()
}

// TestDockerfileAgrees parses the Dockerfile and checks that its manager and worker stages put in
// their images the files, user and entrypoint the builder does.
func TestDockerfileAgrees(t *testing.T) {
	_, set := testImages(t)
	dockerfile := readFile(t, filepath.Join(repoRoot, "Dockerfile"))
	list := readWorkerList(t, filepath.Join(repoRoot, "hack", "images", "worker-files.txt"))
	for _, p := range testPlatforms {
		for _, c := range []struct {
			stage string
			idx   v1.ImageIndex
		}{{"manager", set.Manager}, {"worker", set.Worker}} {
			img := platformImage(t, c.idx, p)
			for _, problem := range compareDockerfile(dockerfile, list, c.stage, p, img, nonDirs(imageFiles(t, img))) {
				t.Errorf("%s stage, %s: %s", c.stage, p, problem)
			}
		}
	}
}

// TestDockerfileMismatchFails seeds differences between the Dockerfile, the list and the image,
// and checks that compareDockerfile reports each one.
func TestDockerfileMismatchFails(t *testing.T) {
	_, set := testImages(t)
	dockerfile := readFile(t, filepath.Join(repoRoot, "Dockerfile"))
	listText := readFile(t, filepath.Join(repoRoot, "hack", "images", "worker-files.txt"))
	p := testPlatforms[0]
	worker := platformImage(t, set.Worker, p)
	manager := platformImage(t, set.Manager, p)
	workerFiles := nonDirs(imageFiles(t, worker))
	managerFiles := nonDirs(imageFiles(t, manager))
	replace := func(s, old, new string) string {
		t.Helper()
		if !strings.Contains(s, old) {
			t.Fatalf("seeding a mismatch: %q is not in the file", old)
		}
		return strings.Replace(s, old, new, 1)
	}
	workerStage := "COPY --from=build /out/worker /usr/local/bin/worker\n"
	for _, c := range []struct {
		name       string
		dockerfile string
		list       string
		stage      string
		files      []string
	}{
		{"a COPY more in the worker stage", replace(dockerfile, workerStage, workerStage+"COPY --from=build /out/manager /usr/bin/extra\n"), listText, "worker", workerFiles},
		{"the worker binary elsewhere", replace(dockerfile, workerStage, "COPY --from=build /out/worker /worker\n"), listText, "worker", workerFiles},
		{"a library missing from the list", dockerfile, replace(listText, "all    /usr/lib/*-linux-gnu/libzstd.so.1*\n", ""), "worker", workerFiles},
		{"a path more in the list", dockerfile, listText + "all    /usr/sbin/insmod\n", "worker", workerFiles},
		{"a file more in the image", dockerfile, listText, "worker", append(slices.Clone(workerFiles), "usr/bin/sh")},
		{"the worker stage not reading the list", replace(dockerfile, "COPY hack/images/worker-files.txt /tmp/worker-files.txt", "COPY hack/images/other.txt /tmp/worker-files.txt"), listText, "worker", workerFiles},
		{"the manager as root", replace(dockerfile, "USER 65532:65532", "USER 0:0"), listText, "manager", managerFiles},
		{"another manager entrypoint", replace(dockerfile, `ENTRYPOINT ["/manager"]`, `ENTRYPOINT ["/bin/manager"]`), listText, "manager", managerFiles},
		{"the manager without the CA bundle", replace(dockerfile, "COPY --from=worker-rootfs /rootfs/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt\n", ""), listText, "manager", managerFiles},
	} {
		t.Run(c.name, func(t *testing.T) {
			list, err := parseWorkerList(c.list)
			if err != nil {
				t.Fatal(err)
			}
			img := worker
			if c.stage == "manager" {
				img = manager
			}
			if problems := compareDockerfile(c.dockerfile, list, c.stage, p, img, c.files); len(problems) == 0 {
				t.Error("compareDockerfile found no difference")
			} else {
				t.Logf("found: %v", problems)
			}
		})
	}
}

// TestDockerfileScriptOnHost runs the Dockerfile's rootfs script on this machine, a Debian 12 like
// the Dockerfile's base image with kmod and ca-certificates installed as the stage installs them,
// into a temporary directory instead of /rootfs, and checks that it copies the entries the builder
// puts in the worker image for this platform: the same paths, types and link targets.
func TestDockerfileScriptOnHost(t *testing.T) {
	_, set := testImages(t)
	p := hostPlatform(t)
	if osRelease := readFile(t, "/etc/os-release"); !strings.Contains(osRelease, "VERSION_CODENAME=bookworm") {
		t.Fatalf("the Dockerfile's Debian stage is debian:bookworm-slim; this test runs its script here and needs Debian 12, this is:\n%s", osRelease)
	}
	ensure := exec.Command(filepath.Join(repoRoot, "test", "scripts", "ensure-packages.sh"), "kmod", "ca-certificates")
	if out, err := ensure.CombinedOutput(); err != nil {
		t.Fatalf("installing kmod and ca-certificates: %v: %s", err, out)
	}
	script, err := rootfsScript(readFile(t, filepath.Join(repoRoot, "Dockerfile")))
	if err != nil {
		t.Fatal(err)
	}
	list, err := filepath.Abs(filepath.Join(repoRoot, "hack", "images", "worker-files.txt"))
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	script = strings.ReplaceAll(strings.ReplaceAll(script, "/tmp/worker-files.txt", list), "/rootfs", rootfs)
	if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil { // #nosec G204 -- the repository's Dockerfile
		t.Fatalf("the Dockerfile's rootfs script: %v: %s", err, out)
	}
	var fromScript []string
	err = filepath.WalkDir(rootfs, func(file string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(rootfs, file)
		line := rel + " file"
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(file)
			if err != nil {
				return err
			}
			line = rel + " -> " + target
		}
		fromScript = append(fromScript, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	files := imageFiles(t, platformImage(t, set.Worker, p))
	var fromBuilder []string
	for _, f := range nonDirs(files) {
		if f == workerPath {
			continue
		}
		line := f + " file"
		if files[f].Type == tar.TypeSymlink {
			line = f + " -> " + files[f].Link
		}
		fromBuilder = append(fromBuilder, line)
	}
	slices.Sort(fromScript)
	if diff := diffLines(fromBuilder, fromScript); diff != "" {
		t.Errorf("the Dockerfile's rootfs script and the builder differ (-builder +script):\n%s", diff)
	}
}

func readFile(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file) // #nosec G304 -- the repository's files
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestPush pushes both layouts to a registry on 127.0.0.1 (plain HTTP) and reads the indexes back.
func TestPush(t *testing.T) {
	_, set := testImages(t)
	out := t.TempDir()
	layouts, err := set.writeLayouts(out, "dev")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, l := range layouts {
		ref := host + "/" + l.Name + ":dev"
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), []string{"push", "--layout", l.Layout, "--ref", ref}, &stdout, &stderr); err != nil {
			t.Fatalf("push %s: %v: %s", l.Name, err, stderr.String())
		}
		if got, want := strings.TrimSpace(stdout.String()), ref+"@"+l.Digest.String(); got != want {
			t.Errorf("push printed %q, want %q", got, want)
		}
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := remote.Index(r)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := idx.Digest(); err != nil || d != l.Digest {
			t.Errorf("%s: the registry has %s (%v), the layout %s", l.Name, d, err, l.Digest)
		}
	}
}

// diffLines returns "" when want and got are equal, else the lines only one of them has, marked
// - (want only) and + (got only).
func diffLines(want, got []string) string {
	if slices.Equal(want, got) {
		return ""
	}
	var b strings.Builder
	for _, w := range want {
		if !slices.Contains(got, w) {
			b.WriteString("-" + w + "\n")
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			b.WriteString("+" + g + "\n")
		}
	}
	if b.Len() == 0 {
		fmt.Fprintf(&b, "same lines in another order or count:\n-%q\n+%q\n", want, got)
	}
	return b.String()
}

// mapLines returns "key value" lines in key order.
func mapLines(m map[string]string) []string {
	var out []string
	for _, k := range sortedKeys(m) {
		out = append(out, k+" "+m[k])
	}
	return out
}
