package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Image names, as the layouts under the output directory are called.
const (
	managerName = "kmm-manager"
	workerName  = "kmm-worker"
)

// Entry points and user of the images.
const (
	managerPath = "manager"
	workerPath  = "usr/local/bin/worker"
	managerUser = "65532:65532"
)

// defaultPath is the PATH of both images (what container engines give an image without one).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// layer returns an OCI layer holding files (keyed by relative path) and their parent directories,
// reproducibly: entries sorted by path, owner 0:0 without names, every time epoch, modes 0755 for
// directories and executables, 0644 for other files, 0777 for symlinks.
func layer(files map[string]*node, epoch time.Time) (v1.Layer, error) {
	entries := map[string]*node{}
	for p, n := range files {
		entries[p] = n
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := files[d]; !ok {
				entries[d] = &node{Type: tar.TypeDir}
			}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range sortedKeys(entries) {
		n := entries[p]
		hdr := &tar.Header{Name: p, Typeflag: n.Type, ModTime: epoch}
		switch n.Type {
		case tar.TypeDir:
			hdr.Name, hdr.Mode = p+"/", 0o755
		case tar.TypeSymlink:
			hdr.Linkname, hdr.Mode = n.Link, 0o777
		case tar.TypeReg:
			hdr.Mode, hdr.Size = 0o644, int64(len(n.Data))
			if n.Mode&0o111 != 0 {
				hdr.Mode = 0o755
			}
		default:
			return nil, fmt.Errorf("%s: tar type %q", p, n.Type)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(n.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression), tarball.WithCompressedCaching)
}

// namedLayer is a layer and the line its history entry gets.
type namedLayer struct {
	Layer     v1.Layer
	CreatedBy string
}

// image returns an OCI image of the layers for p with config cfg, every time set to epoch.
func image(p platform, epoch time.Time, cfg v1.Config, layers ...namedLayer) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l.Layer, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: l.CreatedBy, Comment: "kmm hack/images"}}
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Variant = p.GOARCH, "linux", p.Variant
	cf.Created = v1.Time{Time: epoch}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// index returns an OCI image index of one image per platform.
func index(imgs []v1.Image, platforms []platform) v1.ImageIndex {
	adds := make([]mutate.IndexAddendum, len(imgs))
	for i, img := range imgs {
		adds[i] = mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: platforms[i].oci()}}
	}
	return mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
}

// assembleOptions are the inputs of assemble.
type assembleOptions struct {
	Platforms []platform
	Binaries  map[string]binaries // by platform.String()
	Debian    *debian
	Epoch     time.Time
}

// imageSet is the two image indexes.
type imageSet struct {
	Manager v1.ImageIndex
	Worker  v1.ImageIndex
}

// assemble builds both image indexes from the Go binaries and Debian's packages:
//
//	kmm-manager: layer 1 the CA bundle; layer 2 /manager
//	kmm-worker:  layer 1 the CA bundle (the same blob); layer 2 kmod's modprobe and depmod with
//	             their libraries and loader; layer 3 /usr/local/bin/worker
func assemble(ctx context.Context, o assembleOptions) (*imageSet, error) {
	if len(o.Platforms) == 0 {
		return nil, errors.New("no platform")
	}
	ca, err := o.Debian.caBundle(ctx, o.Platforms[0])
	if err != nil {
		return nil, err
	}
	caLayer, err := layer(map[string]*node{caBundlePath: {Type: tar.TypeReg, Mode: 0o644, Data: ca}}, o.Epoch)
	if err != nil {
		return nil, err
	}
	var managers, workers []v1.Image
	for _, p := range o.Platforms {
		bins, ok := o.Binaries[p.String()]
		if !ok {
			return nil, fmt.Errorf("no binaries for %s", p)
		}
		manager, err := staticBinary(bins.Manager, p)
		if err != nil {
			return nil, err
		}
		worker, err := staticBinary(bins.Worker, p)
		if err != nil {
			return nil, err
		}
		t, c, err := o.Debian.kmodFiles(ctx, p)
		if err != nil {
			return nil, err
		}
		kmod := map[string]*node{}
		for _, k := range c.Keys {
			kmod[k] = t[k]
		}
		kmodLayer, err := layer(kmod, o.Epoch)
		if err != nil {
			return nil, err
		}
		managerLayer, err := layer(map[string]*node{managerPath: manager}, o.Epoch)
		if err != nil {
			return nil, err
		}
		workerLayer, err := layer(map[string]*node{workerPath: worker}, o.Epoch)
		if err != nil {
			return nil, err
		}
		caL := namedLayer{caLayer, "/" + caBundlePath + " from Debian's ca-certificates"}
		m, err := image(p, o.Epoch, v1.Config{User: managerUser, Entrypoint: []string{"/" + managerPath}, Env: []string{defaultPath}},
			caL, namedLayer{managerLayer, "/" + managerPath + " (go build ./cmd/manager)"})
		if err != nil {
			return nil, err
		}
		w, err := image(p, o.Epoch, v1.Config{Entrypoint: []string{"/" + workerPath}, Env: []string{defaultPath}},
			caL, namedLayer{kmodLayer, "modprobe, depmod and their libraries from Debian's " + joinPackages(t, c.Keys)},
			namedLayer{workerLayer, "/" + workerPath + " (go build ./cmd/worker)"})
		if err != nil {
			return nil, err
		}
		managers, workers = append(managers, m), append(workers, w)
	}
	return &imageSet{Manager: index(managers, o.Platforms), Worker: index(workers, o.Platforms)}, nil
}

// joinPackages names the packages the keys come from.
func joinPackages(t tree, keys []string) string {
	pkgs := map[string]bool{}
	for _, k := range keys {
		if p := t[k].Pkg; p != "" {
			pkgs[p] = true
		}
	}
	return strings.Join(sortedKeys(pkgs), ", ")
}

// staticBinary reads a Go binary and checks that it is a static executable for p.
func staticBinary(file string, p platform) (*node, error) {
	data, err := os.ReadFile(file) // #nosec G304 -- a binary we built
	if err != nil {
		return nil, err
	}
	if err := checkStatic(data, p); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &node{Type: tar.TypeReg, Mode: 0o755, Data: data}, nil
}

// layoutDigest is what build reports for one layout.
type layoutDigest struct {
	Name   string
	Digest v1.Hash
	Layout string
}

// writeLayouts writes each index as an OCI layout <out>/<name> whose index.json names it with the
// tag, replacing what was there.
func (s *imageSet) writeLayouts(out, tag string) ([]layoutDigest, error) {
	var res []layoutDigest
	for _, x := range []struct {
		name string
		idx  v1.ImageIndex
	}{{managerName, s.Manager}, {workerName, s.Worker}} {
		dir := filepath.Join(out, x.name)
		if err := writeLayout(dir, x.idx, tag); err != nil {
			return nil, err
		}
		d, err := x.idx.Digest()
		if err != nil {
			return nil, err
		}
		res = append(res, layoutDigest{Name: x.name, Digest: d, Layout: dir})
	}
	return res, nil
}

// writeLayout writes idx as an OCI layout at dir (built beside it, then renamed into place).
func writeLayout(dir string, idx v1.ImageIndex, tag string) error {
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	top := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add:        idx,
		Descriptor: v1.Descriptor{Annotations: map[string]string{"org.opencontainers.image.ref.name": tag}},
	})
	if _, err := layout.Write(tmp, top); err != nil {
		return fmt.Errorf("writing the OCI layout %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// layoutIndex returns the image index a layout written by writeLayout holds.
func layoutIndex(dir string) (v1.ImageIndex, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	top, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(im.Manifests) != 1 || !im.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("%s: want one image index in index.json, got %d entries", dir, len(im.Manifests))
	}
	return top.ImageIndex(im.Manifests[0].Digest)
}

// push copies the image index of the layout at dir to ref (plain HTTP for localhost and
// 127.0.0.1, as go-containerregistry does) and returns its digest.
func push(ctx context.Context, dir, ref string) (v1.Hash, error) {
	idx, err := layoutIndex(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.WriteIndex(r, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("pushing %s to %s: %w", dir, ref, err)
	}
	return idx.Digest()
}
