package module

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/fsm"
)

// TestGateImages: only a node whose mapping has a recipe and whose image is not Present waits;
// a node without a recipe, or with its image Present, does not; no MIC yet means wait.
func TestGateImages(t *testing.T) {
	m := &kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gpu"}, Spec: kmmv1beta1.ModuleSpec{
		Selector: map[string]string{"x": "y"},
		ModuleLoader: &kmmv1beta1.ModuleLoaderSpec{Container: kmmv1beta1.ModuleLoaderContainerSpec{
			Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "gpu"},
			KernelMappings: []kmmv1beta1.KernelMapping{
				{Literal: "6.1.0-1-amd64", ContainerImage: "reg/gpu:1", Build: &kmmv1beta1.Build{DockerfileConfigMap: &corev1.LocalObjectReference{Name: "df"}}},
				{Literal: "6.1.0-2-amd64", ContainerImage: "reg/gpu:2"},
			}}}}}
	decide := func(kernel string) fsm.SpecDecision {
		return fsm.DecideSpec(m, fsm.NodeView{Name: kernel, Labels: map[string]string{"x": "y"}, KernelVersion: kernel})
	}
	decisions := map[string]fsm.SpecDecision{"built": decide("6.1.0-1-amd64"), "pulled": decide("6.1.0-2-amd64")}
	gated := gateImages(m, decisions, nil)
	if _, ok := gated["built"]; !ok || len(gated) != 1 {
		t.Fatalf("gated %v, want only the node whose image is built, before any MIC", gated)
	}
	mic := &kmmv1beta1.ModuleImagesConfig{Status: kmmv1beta1.ModuleImagesConfigStatus{ImagesStates: []kmmv1beta1.ModuleImageState{
		{Image: "reg/gpu:1", State: kmmv1beta1.ImageBuildBackOff, Message: "the build failed: Error 2"}}}}
	gated = gateImages(m, decisions, mic)
	waits, failing := imageWaits(gated)
	if len(waits) != 0 || len(failing) != 1 || !strings.Contains(failing[0], "Error 2") {
		t.Fatalf("waits %v failing %v, want the failing build", waits, failing)
	}
	mic.Status.ImagesStates[0].State = kmmv1beta1.ImagePresent
	if gated := gateImages(m, decisions, mic); len(gated) != 0 {
		t.Fatalf("gated %v with the image Present", gated)
	}
}

// TestConditionsOfAnImageWait: nodes waiting for an image make Ready ImageNotReady naming it; a
// failing build makes the Module Degraded ImageFailing.
func TestConditionsOfAnImageWait(t *testing.T) {
	now := metav1.Now()
	conds := moduleConditions(conditionFacts{progress: kmmv1beta1.DaemonSetStatus{DesiredNumber: 2}, what: "loaded",
		imageWaits: []string{"reg/gpu:1 (Building)"}, now: now})
	if conds[0].Reason != kmmv1beta1.ReasonImageNotReady || conds[1].Reason != kmmv1beta1.ReasonImageNotReady ||
		!strings.Contains(conds[1].Message, "reg/gpu:1 (Building)") || conds[2].Status != metav1.ConditionFalse {
		t.Fatalf("conditions %+v", conds)
	}
	conds = moduleConditions(conditionFacts{progress: kmmv1beta1.DaemonSetStatus{DesiredNumber: 2}, what: "loaded",
		imageFailing: []string{"reg/gpu:1 (BuildBackOff: Error 2)"}, now: now})
	if conds[2].Reason != kmmv1beta1.ReasonImageFailing || !strings.Contains(conds[2].Message, "Error 2") {
		t.Fatalf("conditions %+v", conds)
	}
}

// TestImageWaitKeepsTheMessagesEnd: a failed build's message is the tail of its log, whose end
// says what failed (the step's output, BuildKit's verdict): the Module's condition keeps that end
// when it bounds the message, not its first bytes (BuildKit's progress lines).
func TestImageWaitKeepsTheMessagesEnd(t *testing.T) {
	msg := "the build failed: " + strings.Repeat("#4 extracting sha256:7a45 26.8s\n", 200) + "0.071 kmm-e2e: the step's own output\nerror: failed to solve"
	got := imageWait{image: "reg/gpu:1", state: kmmv1beta1.ImageBuildBackOff, message: msg}.String()
	if !strings.Contains(got, "kmm-e2e: the step's own output\nerror: failed to solve)") || len(got) > 1100 {
		t.Fatalf("%d bytes: %q, want at most 1100 ending with the message's end", len(got), got)
	}
}
