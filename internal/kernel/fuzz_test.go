package kernel

import (
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics, that what it accepts compares equal to itself, and
// that its XYZ form parses back to the same first three components.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"5.14.0-553.el9.x86_64", "6.1.0-56-cloud-amd64", "6.8+", "1.2.3.4.5.6", "0", "5..1", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Parse(s)
		if err != nil {
			return
		}
		if v.Compare(v) != 0 {
			t.Fatalf("%q does not compare equal to itself", s)
		}
		if strings.HasSuffix(v.Full, "+") {
			t.Fatalf("Full %q keeps the trailing +", v.Full)
		}
		back, err := Parse(v.XYZ())
		if err != nil || back.Compare(Version{Release: v.components(3)}) != 0 {
			t.Fatalf("XYZ %q of %q does not parse back: %v", v.XYZ(), s, err)
		}
	})
}

// FuzzParseRange checks that ParseRange never panics and that "=v" contains v for every version.
func FuzzParseRange(f *testing.F) {
	for _, s := range []string{">=5.14.0 <6.0", "<4 || >=6", ">= 6.1, < 6.2", "=5.14", "", "||", "<<5"} {
		f.Add(s, "5.14.0-553.el9.x86_64")
	}
	f.Fuzz(func(t *testing.T, rng, kernel string) {
		if r, err := ParseRange(rng); err == nil {
			if v, err := Parse(kernel); err == nil {
				_ = r.Contains(v)
			}
		}
		v, err := Parse(kernel)
		if err != nil || strings.ContainsAny(kernel, " ,|<>=!\t") {
			return
		}
		r, err := ParseRange("=" + v.Full)
		if err != nil {
			t.Fatalf("ParseRange(=%s): %v", v.Full, err)
		}
		if !r.Contains(v) {
			t.Fatalf("=%s does not contain %s", v.Full, v.Full)
		}
	})
}
