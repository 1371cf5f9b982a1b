package e2e

import (
	"testing"

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
