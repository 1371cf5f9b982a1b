package module

import (
	"context"
	"fmt"
	"sort"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
	"github.com/kmm-project/kmm/image"
	"github.com/kmm-project/kmm/internal/kernel/mapping"
)

// The image gate (issue 37, docs/build.md): a node whose kernel mapping builds or signs its image
// gets its NMC spec entry only once the image controller found that image in its registry
// (image.MayLoad on the MIC status entry). Until then the node keeps the entry it has — none for a
// first load, the previous image for an image bump or a rebuild — so no worker ever starts for an
// image that is not there, and the node side (fsm.Step) needs no new fact: what a node may load is
// the Module side's decision, when it loads stays the node side's.

// imageWait is an image some nodes wait for.
type imageWait struct {
	image string
	// state is the image machine's state ("" before the image controller wrote one).
	state   kmmv1beta1.ImageMachineState
	message string
}

// failing says whether the image's build or sign failed and waits for its back-off.
func (w imageWait) failing() bool {
	return w.state == kmmv1beta1.ImageBuildBackOff || w.state == kmmv1beta1.ImageSignBackOff || w.state == kmmv1beta1.ImageMissing
}

func (w imageWait) String() string {
	state := string(w.state)
	if state == "" {
		state = "not checked yet"
	}
	if w.message == "" {
		return fmt.Sprintf("%s (%s)", w.image, state)
	}
	// The end: a failed build's message is its log's tail, which ends with what failed.
	return fmt.Sprintf("%s (%s: %s)", w.image, state, lastBytes(w.message, 1024))
}

// lastBytes is s, or "…" and its last n bytes (whole runes).
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return "…" + s[i:]
}

// readMIC reads the Module's ModuleImagesConfig when the Module has a recipe (nil otherwise, or
// when the image controller has not created it yet).
func (r *Reconciler) readMIC(ctx context.Context, m *kmmv1beta1.Module) (*kmmv1beta1.ModuleImagesConfig, error) {
	if !mapping.HasRecipe(m) {
		return nil, nil
	}
	mic := &kmmv1beta1.ModuleImagesConfig{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(m), mic)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return mic, err
}

// gateImages is pure: for each node whose decision writes an entry whose image the Module makes in
// the cluster and that may not be loaded yet, the image it waits for.
func gateImages(m *kmmv1beta1.Module, decisions map[string]fsm.SpecDecision, mic *kmmv1beta1.ModuleImagesConfig) map[string]imageWait {
	out := map[string]imageWait{}
	for node, d := range decisions {
		if d.Action != fsm.SpecUpdate || d.Entry == nil || d.Reason == fsm.ReasonRollback {
			continue // a rollback's image was loaded on the nodes before: it is there
		}
		if b, s := mapping.Recipe(m, d.Entry.Config.KernelVersion); b == nil && s == nil {
			continue
		}
		img := d.Entry.Config.ContainerImage
		var st *kmmv1beta1.ModuleImageState
		if mic != nil {
			st = mic.ImageStateEntry(img)
		}
		if image.MayLoad(st) {
			continue
		}
		w := imageWait{image: img}
		if st != nil {
			w.state, w.message = st.State, st.Message
		}
		out[node] = w
	}
	return out
}

// imageWaits lists the distinct images waited for, sorted, and whether one of them is failing.
func imageWaits(gated map[string]imageWait) (waits []string, failing []string) {
	seen := map[string]bool{}
	for _, w := range gated {
		if seen[w.image] {
			continue
		}
		seen[w.image] = true
		if w.failing() {
			failing = append(failing, w.String())
		} else {
			waits = append(waits, w.String())
		}
	}
	sort.Strings(waits)
	sort.Strings(failing)
	return waits, failing
}
