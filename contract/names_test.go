package contract

import (
	"strings"
	"testing"

	apivalidation "k8s.io/apimachinery/pkg/util/validation"
)

func TestBounded(t *testing.T) {
	short := "gpu-device-plugin-v1"
	if got := Bounded(short, MaxLabelValue); got != short {
		t.Fatalf("Bounded(%q) = %q, want it unchanged", short, got)
	}
	long := "a-module-name-of-forty-characters-abcdef-device-plugin-" + strings.Repeat("v1.2.3-rc.", 6)
	a, b := Bounded(long, MaxLabelValue), Bounded(long+"x", MaxLabelValue)
	for _, got := range []string{a, b} {
		if len(got) != MaxLabelValue {
			t.Errorf("Bounded gave %d characters, want %d: %q", len(got), MaxLabelValue, got)
		}
		if errs := apivalidation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("Bounded gave an invalid label value %q: %v", got, errs)
		}
		if errs := apivalidation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("Bounded gave an invalid object name %q: %v", got, errs)
		}
	}
	if a == b {
		t.Fatalf("two long names collide: %q", a)
	}
	// A cut that would end in a dot or dash is moved back to a letter or digit.
	dotted := strings.Repeat("ab.", 30)
	if got := Bounded(dotted, MaxLabelValue); len(apivalidation.IsDNS1123Subdomain(got)) > 0 {
		t.Fatalf("Bounded(%q) = %q, not a valid name", dotted, got)
	}
}
