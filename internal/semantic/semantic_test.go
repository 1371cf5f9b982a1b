package semantic

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

func TestEqualIsSemantic(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entry := func(state kmmv1beta1.ModuleState, when time.Time, transitions []kmmv1beta1.Transition) kmmv1beta1.NodeModuleStatus {
		return kmmv1beta1.NodeModuleStatus{Namespace: "ns", Name: "m", State: state, LastTransitionTime: metav1.NewTime(when),
			Transitions: transitions}
	}
	tests := []struct {
		name string
		a, b kmmv1beta1.NodeModuleStatus
		want bool
	}{
		{"identical", entry("Loaded", at, nil), entry("Loaded", at, nil), true},
		{"nil and empty transitions", entry("Loaded", at, nil), entry("Loaded", at, []kmmv1beta1.Transition{}), true},
		{"the same instant in another location", entry("Loaded", at, nil), entry("Loaded", at.In(time.FixedZone("x", 3600)), nil), true},
		{"another state", entry("Loaded", at, nil), entry("Loading", at, nil), false},
		{"another time", entry("Loaded", at, nil), entry("Loaded", at.Add(time.Second), nil), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Equal(&tt.a, &tt.b); got != tt.want {
				t.Errorf("Equal = %v, want %v", got, tt.want)
			}
		})
	}
}

func BenchmarkEqualStatus(b *testing.B) {
	at := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var st []kmmv1beta1.NodeModuleStatus
	for range 10 {
		st = append(st, kmmv1beta1.NodeModuleStatus{Namespace: "ns", Name: "m", State: "Loaded", LastTransitionTime: at,
			Config: &kmmv1beta1.ModuleConfig{KernelVersion: "6.1", ContainerImage: "r/m:1"}})
	}
	next := append([]kmmv1beta1.NodeModuleStatus(nil), st...)
	for b.Loop() {
		if !Equal(&next, &st) {
			b.Fatal("not equal")
		}
	}
}
