package kernel

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		name, in string
		release  []int
		build    int
		hasBuild bool
		wantErr  string
	}{
		{name: "rhel", in: "5.14.0-553.el9.x86_64", release: []int{5, 14, 0}, build: 553, hasBuild: true},
		{name: "debian cloud", in: "6.1.0-56-cloud-amd64", release: []int{6, 1, 0}, build: 56, hasBuild: true},
		{name: "plain", in: "6.8", release: []int{6, 8}},
		{name: "trailing plus ignored", in: "6.8.0+", release: []int{6, 8, 0}},
		{name: "suffix without number", in: "6.6.8-arch1-1", release: []int{6, 6, 8}},
		{name: "empty", in: "", wantErr: "empty kernel version"},
		{name: "letters in release", in: "5.x.0", wantErr: `component "x" is not a number`},
		{name: "too many components", in: "1.2.3.4.5.6.7", wantErr: "more than 6"},
		{name: "empty component", in: "5..1", wantErr: `component "" is not a number`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Parse(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse(%q) error = %v, want it to contain %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if !equalInts(v.Release, tc.release) || v.Build != tc.build || v.HasBuild != tc.hasBuild {
				t.Fatalf("Parse(%q) = %+v, want release %v build %d/%v", tc.in, v, tc.release, tc.build, tc.hasBuild)
			}
		})
	}
}

func TestRangeContains(t *testing.T) {
	cases := []struct {
		rng, kernel string
		want        bool
	}{
		{">=5.14.0 <6.0", "5.14.0-553.el9.x86_64", true},
		{">=5.14.0 <6.0", "6.0.3-1", false},
		{">=5.14.0 <6.0", "5.4.0", false},
		{">=5.4", "5.10.0", true}, // numeric, not lexical
		{"<5.10", "5.4.100", true},
		{"<5.14.0-600", "5.14.0-553.el9.x86_64", true},
		{"<5.14.0-600", "5.14.0-601.el9.x86_64", false},
		{"=5.14", "5.14.7-1", true},
		{"5.14", "5.14.7-1", true},
		{"!=5.14", "5.14.7-1", false},
		{">= 6.1, < 6.2", "6.1.0-56-cloud-amd64", true},
		{"<4 || >=6", "6.1.0", true},
		{"<4 || >=6", "5.1.0", false},
		{">6.1.0", "6.1.0-56", false},
		{"<=6.1.0", "6.1.0-56", true},
		{"==6.1.0-56", "6.1.0-56-cloud-amd64", true},
	}
	for _, tc := range cases {
		t.Run(tc.rng+" "+tc.kernel, func(t *testing.T) {
			r, err := ParseRange(tc.rng)
			if err != nil {
				t.Fatalf("ParseRange(%q): %v", tc.rng, err)
			}
			v, err := Parse(tc.kernel)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.kernel, err)
			}
			if got := r.Contains(v); got != tc.want {
				t.Fatalf("%q contains %q = %v, want %v", tc.rng, tc.kernel, got, tc.want)
			}
		})
	}
}

func TestParseRangeErrors(t *testing.T) {
	for _, in := range []string{"", ">=", ">=5.x", "5.14 ||", "~5.14", "<<5"} {
		if _, err := ParseRange(in); err == nil {
			t.Errorf("ParseRange(%q) succeeded, want an error", in)
		}
	}
}

func TestExpandImage(t *testing.T) {
	v, err := Parse("5.14.0-553.el9.x86_64")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ExpandImage("reg.io/${MOD_NAMESPACE}/$MOD_NAME:$KERNEL_FULL_VERSION-$KERNEL_X.$KERNEL_Y.$KERNEL_Z-$KERNEL_XYZ", v, "nic", "drivers")
	if err != nil {
		t.Fatal(err)
	}
	if want := "reg.io/drivers/nic:5.14.0-553.el9.x86_64-5.14.0-5.14.0"; got != want {
		t.Fatalf("ExpandImage = %q, want %q", got, want)
	}
	if _, err := ExpandImage("reg.io/x:$KERNEL_RELEASE", v, "nic", "drivers"); err == nil || !strings.Contains(err.Error(), "unknown variable $KERNEL_RELEASE") {
		t.Fatalf("ExpandImage with an unknown variable: error = %v", err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCheckStringBoundsWhatANodeMaySay(t *testing.T) {
	ok := []string{"6.1.0-56-cloud-amd64", "5.14.0-553.el9_4.x86_64", "6.8.0+", "4.18.0-1~bpo", strings.Repeat("1", MaxLength)}
	for _, s := range ok {
		if err := CheckString(s); err != nil {
			t.Errorf("CheckString(%q) = %v, want nil", s, err)
		}
	}
	bad := []string{"", ".", "..", "6.1/../../etc", "6.1\x00", "6.1 0", strings.Repeat("1", MaxLength+1), "ünïcode"}
	for _, s := range bad {
		if err := CheckString(s); err == nil {
			t.Errorf("CheckString(%q) = nil, want an error", s)
		}
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted it", s)
		}
	}
}

func TestCompilePatternBoundsCost(t *testing.T) {
	if _, err := CompilePattern(`^5\.14\.0-[0-9]+\.el9\.x86_64$`); err != nil {
		t.Fatalf("a usual pattern was refused: %v", err)
	}
	for _, p := range []string{`\pL{1000}\pN{1000}`, strings.Repeat("a", MaxPatternLength+1), `(`} {
		if _, err := CompilePattern(p); err == nil {
			t.Errorf("CompilePattern(%.40q) = nil error, want one", p)
		}
	}
}
