package worker

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/contract"
)

// A kmod image may depend on in-tree modules of the node: upstream KMM's layout links
// <dirName>/lib/modules/<kernel>/host to /host/lib/modules/<kernel>, where worker pods see the
// node's /lib/modules, and depmod (run with that link in place) records the in-tree dependency as
// host/<path>. These tests use the real depmod and modprobe -n with a sandbox standing for the
// node's module tree.

// hostLinkFixture is a node module tree holding the "in-tree" kmm_test_b and a kmod image
// directory holding kmm_test_a only, whose depmod output reaches kmm_test_b through the host link.
type hostLinkFixture struct {
	// hostModules stands for the node's /lib/modules (the worker's HostModulesDir).
	hostModules string
	// image are the kmod image's entries under opt/, the host link among them.
	image []entry
}

// newHostLinkFixture builds the fixture; link is the host link's target as the image stores it.
func newHostLinkFixture(t *testing.T, link string) hostLinkFixture {
	t.Helper()
	depmod := requireTool(t, "depmod", "kmod")
	tree := moduleTree(t)
	base := t.TempDir()
	hostModules := filepath.Join(base, "node/lib/modules")
	inTree := filepath.Join(hostModules, testKernel, "kernel/drivers")
	imgKernel := filepath.Join(base, "img/opt/lib/modules", testKernel)
	for _, d := range []string{inTree, filepath.Join(imgKernel, "extra")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyTestFile(t, filepath.Join(tree, "lib/modules", testKernel, "extra/kmm_test_b.ko"), filepath.Join(inTree, "kmm_test_b.ko"))
	copyTestFile(t, filepath.Join(tree, "lib/modules", testKernel, "extra/kmm_test_a.ko"), filepath.Join(imgKernel, "extra/kmm_test_a.ko"))
	if out, err := exec.Command(depmod, "-b", filepath.Join(base, "node"), testKernel).CombinedOutput(); err != nil {
		t.Fatalf("depmod of the node tree: %v: %s", err, out)
	}
	// The image is built as upstream documents it: the link in place while depmod runs (here to
	// the sandbox's tree, in the image to /host/lib/modules/<kernel>).
	if err := os.Symlink(filepath.Join(hostModules, testKernel), filepath.Join(imgKernel, "host")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(depmod, "-b", filepath.Join(base, "img/opt"), testKernel).CombinedOutput(); err != nil {
		t.Fatalf("depmod of the image tree: %v: %s", err, out)
	}
	if dep, _ := os.ReadFile(filepath.Join(imgKernel, "modules.dep")); !strings.Contains(string(dep), "extra/kmm_test_a.ko: host/kernel/drivers/kmm_test_b.ko") {
		t.Fatalf("depmod did not record the in-tree dependency through the host link:\n%s", dep)
	}
	var entries []entry
	src := filepath.Join(base, "img")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		name := filepath.ToSlash(rel)
		switch {
		case p == src:
		case d.Type()&fs.ModeSymlink != 0:
			entries = append(entries, entry{Name: name, Type: tar.TypeSymlink, Linkname: link})
		case d.IsDir():
			entries = append(entries, dir(name+"/"))
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			entries = append(entries, file(name, string(data)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hostLinkFixture{hostModules: hostModules, image: entries}
}

func copyTestFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// treeDigest hashes every path, mode, link target and file content below dir.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h.Write([]byte(p + "\x00" + info.Mode().String() + "\x00"))
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			h.Write([]byte(target))
			return err
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			h.Write(data)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

var hostTarget = path.Join(contract.HostModulesDir, testKernel)

func TestLoadResolvesAnInTreeDependencyThroughTheHostLink(t *testing.T) {
	fx := newHostLinkFixture(t, hostTarget)
	before := treeDigest(t, fx.hostModules)
	reg := newTestRegistry(t, registryOpts{})
	ref, digest := reg.push(t, "kmod/intree-dep:v1", image(t, fx.image))
	s := newSandbox(t)
	m := newRecorder(t)
	cfg := testConfig(ref)

	res := newTestWorker(t, s, m, func(o *Options) { o.HostModulesDir = fx.hostModules }).Run(context.Background(), contract.ActionLoad, cfg)
	mustSucceed(t, res)

	root := entryRoot(s, digest, cfg)
	link := filepath.Join(root, "opt/lib/modules", testKernel, "host")
	if got, err := os.Readlink(link); err != nil || got != filepath.Join(fx.hostModules, testKernel) {
		t.Errorf("the host link in the extraction is %q (%v), want it to name the node's tree %s", got, err, filepath.Join(fx.hostModules, testKernel))
	}
	// The real modprobe -n resolved the in-tree kmm_test_b through the link, before kmm_test_a.
	out := m.stdout.String()
	ib := strings.Index(out, "insmod "+filepath.Join(root, "opt/lib/modules", testKernel, "host/kernel/drivers/kmm_test_b.ko"))
	ia := strings.Index(out, "insmod "+filepath.Join(root, "opt/lib/modules", testKernel, "extra/kmm_test_a.ko"))
	if ib < 0 || ia < 0 || ib > ia {
		t.Errorf("modprobe -n should insmod the in-tree kmm_test_b through the host link, then kmm_test_a:\n%s", out)
	}
	if len(m.loads()) != 1 {
		t.Errorf("modprobe loads %q, want one", m.loads())
	}
	if after := treeDigest(t, fx.hostModules); after != before {
		t.Error("the node's module tree changed during the load")
	}
}

// TestHostLinkElsewhereIsRefused: only <dirName>/lib/modules/<kernel>/host, linking to
// /host/lib/modules/<the same kernel>, may leave the image; every other way into the node's
// module tree is refused before modprobe runs, and nothing is written there.
func TestHostLinkElsewhereIsRefused(t *testing.T) {
	kd := "opt/lib/modules/" + testKernel
	cases := map[string]struct {
		link    string // the host link's target ("" keeps the allowed one)
		extra   []entry
		noMount bool
		want    string
	}{
		"another kernel's tree":          {link: path.Join(contract.HostModulesDir, "5.0.0-other"), want: "unsafe archive entry"},
		"a subdirectory of the tree":     {link: hostTarget + "/kernel", want: "unsafe archive entry"},
		"the host's /etc":                {link: "/host/etc", want: "unsafe archive entry"},
		"climbing out relatively":        {link: "../../../../../host/lib/modules/" + testKernel, want: "unsafe archive entry"},
		"a second link at another place": {extra: []entry{{Name: kd + "/extra/also", Type: tar.TypeSymlink, Linkname: hostTarget}}, want: "unsafe archive entry"},
		"a file written through the link": {extra: []entry{file(kd+"/host/kernel/drivers/kmm_test_b.ko", "replaced")},
			want: "extracting"},
		"a worker without the node's tree mounted": {noMount: true, want: "unsafe archive entry"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			link := tc.link
			if link == "" {
				link = hostTarget
			}
			fx := newHostLinkFixture(t, link)
			before := treeDigest(t, fx.hostModules)
			reg := newTestRegistry(t, registryOpts{})
			ref, _ := reg.push(t, "kmod/intree-dep:v1", image(t, fx.image, tc.extra))
			s := newSandbox(t)
			m := newRecorder(t)
			w := newTestWorker(t, s, m, func(o *Options) {
				if !tc.noMount {
					o.HostModulesDir = fx.hostModules
				}
			})
			res := w.Run(context.Background(), contract.ActionLoad, testConfig(ref))
			if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonOther || !strings.Contains(res.Message, tc.want) {
				t.Errorf("outcome %s reason %s: %s; want Failed, Other, %q", res.Outcome, res.Reason, res.Message, tc.want)
			}
			if len(m.calls) != 0 {
				t.Errorf("modprobe ran: %q", m.calls)
			}
			assertNothingLoaded(t, s, m)
			if after := treeDigest(t, fx.hostModules); after != before {
				t.Error("the node's module tree changed")
			}
		})
	}
}
