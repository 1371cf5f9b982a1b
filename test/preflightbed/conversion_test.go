package preflightbed

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
	"github.com/kmm-project/kmm/test/poll"
)

// TestConversionThroughTheAPIServer creates a PreflightValidation in each version and reads it in
// the other, through the real API server and the operator's conversion webhook (v1beta2 stored):
// the spec and every status entry must say the same in both, by the mapping of
// api/v1beta1/preflightvalidation_conversion.go (True ⇄ Success, False at Image ⇄ InProgress,
// False at Done ⇄ Failure). The status is written in the created version too, so that each
// status word crosses the webhook in both directions.
func TestConversionThroughTheAPIServer(t *testing.T) {
	ctx := context.Background()
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	entries := []kmmv1beta1.PreflightValidationModuleStatus{
		{Namespace: "a", Name: "served", VerificationStatus: kmmv1beta1.VerificationTrue, VerificationStage: kmmv1beta1.VerificationStageDone, Reason: kmmv1beta1.PreflightReasonSuccess, Image: "reg/x:1", LastTransitionTime: now},
		{Namespace: "a", Name: "retried", VerificationStatus: kmmv1beta1.VerificationFalse, VerificationStage: kmmv1beta1.VerificationStageImage, Reason: kmmv1beta1.PreflightReasonRegistryUnreachable, StatusReason: "no answer", LastTransitionTime: now},
		{Namespace: "b", Name: "missing", VerificationStatus: kmmv1beta1.VerificationFalse, VerificationStage: kmmv1beta1.VerificationStageDone, Reason: kmmv1beta1.PreflightReasonImageMissing, LastTransitionTime: now},
	}
	wantV2 := map[string]string{"a/served": kmmv1beta2.VerificationSuccess, "a/retried": kmmv1beta2.VerificationInProgress, "b/missing": kmmv1beta2.VerificationFailure}

	t.Run("created as v1beta1, read as v1beta2", func(t *testing.T) {
		v1 := &kmmv1beta1.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "conv-from-v1beta1", Labels: map[string]string{"made": "v1beta1"}},
			Spec: kmmv1beta1.PreflightValidationSpec{KernelVersion: "6.1.0-13-amd64"}}
		if err := k8s.Create(ctx, v1); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), v1) })
		writeStatus(t, v1, func() { v1.Status.Modules = entries })
		same(t, v1.Name, wantV2)
	})

	t.Run("created as v1beta2, read as v1beta1", func(t *testing.T) {
		v2 := &kmmv1beta2.PreflightValidation{ObjectMeta: metav1.ObjectMeta{Name: "conv-from-v1beta2", Labels: map[string]string{"made": "v1beta2"}},
			Spec: kmmv1beta2.PreflightValidationSpec{KernelVersion: "6.1.0-13-amd64"}}
		if err := k8s.Create(ctx, v2); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), v2) })
		writeStatus(t, v2, func() {
			v2.Status.Modules = nil
			for _, e := range entries {
				v2.Status.Modules = append(v2.Status.Modules, kmmv1beta2.PreflightValidationModuleStatus{
					Namespace: e.Namespace, Name: e.Name, VerificationStatus: wantV2[e.Namespace+"/"+e.Name], VerificationStage: e.VerificationStage,
					Reason: e.Reason, StatusReason: e.StatusReason, Image: e.Image, LastTransitionTime: e.LastTransitionTime})
			}
		})
		same(t, v2.Name, wantV2)
	})
}

// writeStatus waits until the operator has written its own status of obj (it verifies every new
// PreflightValidation once, and nothing in this test makes it verify again), then sets obj's
// status with set and writes it.
func writeStatus[T client.Object](t *testing.T, obj T, set func()) {
	t.Helper()
	ctx := context.Background()
	poll.Until(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		v2 := &kmmv1beta2.PreflightValidation{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), v2); err != nil {
			return false, err.Error()
		}
		return v2.Status.ObservedGeneration == v2.Generation, "the operator's first verification"
	})
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		set()
		return k8s.Status().Update(ctx, obj)
	})
	if err != nil {
		t.Fatalf("writing the status: %v", err)
	}
}

// same reads the PreflightValidation name in both versions at one resourceVersion and checks that
// they say the same: metadata, spec, and each entry (the status word by wantV2, the rest equal).
func same(t *testing.T, name string, wantV2 map[string]string) {
	t.Helper()
	ctx := context.Background()
	poll.Until(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		v1, v2 := &kmmv1beta1.PreflightValidation{}, &kmmv1beta2.PreflightValidation{}
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, v1); err != nil {
			return false, fmt.Sprintf("reading as v1beta1: %v", err)
		}
		if err := k8s.Get(ctx, client.ObjectKey{Name: name}, v2); err != nil {
			return false, fmt.Sprintf("reading as v1beta2: %v", err)
		}
		if v1.ResourceVersion != v2.ResourceVersion {
			return false, "written between the reads"
		}
		if p := differences(v1, v2, wantV2); p != "" {
			return false, p
		}
		return true, ""
	})
}

// differences says how a v1beta1 and a v1beta2 read of one object disagree ("" when they agree
// and hold the entries of wantV2 with its status words).
func differences(v1 *kmmv1beta1.PreflightValidation, v2 *kmmv1beta2.PreflightValidation, wantV2 map[string]string) string {
	if v1.UID != v2.UID || v1.Generation != v2.Generation || v1.Labels["made"] != v2.Labels["made"] || v1.Spec.KernelVersion != v2.Spec.KernelVersion {
		return fmt.Sprintf("metadata or spec differ: %+v / %+v", v1.ObjectMeta, v2.ObjectMeta)
	}
	if len(v1.Status.Modules) != len(wantV2) || len(v2.Status.Modules) != len(wantV2) {
		return fmt.Sprintf("entries: v1beta1 %d, v1beta2 %d, want %d", len(v1.Status.Modules), len(v2.Status.Modules), len(wantV2))
	}
	for i, a := range v1.Status.Modules {
		b, key := v2.Status.Modules[i], a.Namespace+"/"+a.Name
		if b.Namespace+"/"+b.Name != key || b.VerificationStatus != wantV2[key] || b.VerificationStage != a.VerificationStage ||
			b.Reason != a.Reason || b.StatusReason != a.StatusReason || b.Image != a.Image || !b.LastTransitionTime.Equal(&a.LastTransitionTime) {
			return fmt.Sprintf("entry %s: v1beta1 %+v, v1beta2 %+v (want v1beta2 status %s)", key, a, b, wantV2[key])
		}
	}
	return ""
}
