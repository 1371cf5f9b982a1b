package webhook

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestModuleNamesAreBounded: a refusal names one Module, several, or the first maxNamedModules of
// a longer list.
func TestModuleNamesAreBounded(t *testing.T) {
	list := func(n int) *kmmv1beta1.ModuleList {
		l := &kmmv1beta1.ModuleList{}
		for i := range n {
			l.Items = append(l.Items, kmmv1beta1.Module{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%d", i)}})
		}
		return l
	}
	for n, want := range map[int]string{
		1:  "Module m0",
		2:  "Modules m0, m1",
		11: "Modules m0, m1, m2, m3, m4, m5, m6, m7, m8, m9 and more",
	} {
		if got := moduleNames(list(n)); got != want {
			t.Errorf("%d Modules: %q, want %q", n, got, want)
		}
	}
}
