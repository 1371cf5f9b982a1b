package module

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/controllers/shared"
)

// TestReleasedEntry: the takeover's manager gives up one Module's entry, and only once that
// Module's manager applied it; the annotation it owns and other entries stay.
func TestReleasedEntry(t *testing.T) {
	takeover := metav1.ManagedFieldsEntry{Manager: takeoverManager, Operation: metav1.ManagedFieldsOperationUpdate, FieldsV1: metav1.NewFieldsV1(
		`{"f:metadata":{"f:annotations":{".":{},"f:kmm.sigs.x-k8s.io/taken-over":{}}},"f:spec":{"f:modules":{` +
			`"k:{\"name\":\"nic\",\"namespace\":\"drivers\"}":{"f:config":{},"f:tolerations":{}},` +
			`"k:{\"name\":\"gpu\",\"namespace\":\"drivers\"}":{"f:config":{}}}}}`)}
	applied := func(name string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: shared.FieldManager("drivers", name), Operation: metav1.ManagedFieldsOperationApply}
	}
	nmc := &kmmv1beta1.NodeModulesConfig{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{takeover, applied("nic")}}}

	if _, changed, err := releasedEntry(nmc, "drivers", "gpu"); err != nil || changed {
		t.Errorf("gpu's manager never applied: released anyway (%v)", err)
	}
	got, changed, err := releasedEntry(nmc, "drivers", "nic")
	if err != nil || !changed || len(got) != 2 {
		t.Fatalf("nic: changed %v, err %v, %d entries", changed, err, len(got))
	}
	want := `{"f:metadata":{"f:annotations":{".":{},"f:kmm.sigs.x-k8s.io/taken-over":{}}},"f:spec":{"f:modules":{"k:{\"name\":\"gpu\",\"namespace\":\"drivers\"}":{"f:config":{}}}}}`
	if raw := got[0].FieldsV1.GetRawString(); raw != want {
		t.Errorf("takeover's fields after releasing nic:\n%s\nwant\n%s", raw, want)
	}
	nmc.ManagedFields = append(got, applied("gpu"))
	got, changed, err = releasedEntry(nmc, "drivers", "gpu")
	if want := `{"f:metadata":{"f:annotations":{".":{},"f:kmm.sigs.x-k8s.io/taken-over":{}}}}`; err != nil || !changed || got[0].FieldsV1.GetRawString() != want {
		t.Errorf("after releasing gpu too: %s (changed %v, err %v), want %s", got[0].FieldsV1.GetRawString(), changed, err, want)
	}
	nmc.ManagedFields = got
	if _, changed, _ := releasedEntry(nmc, "drivers", "gpu"); changed {
		t.Error("released twice")
	}
}
