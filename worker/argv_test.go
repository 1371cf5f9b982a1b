package worker

import (
	"slices"
	"strings"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

func mcWith(mp kmmv1beta1.ModprobeSpec) kmmv1beta1.ModuleConfig {
	return kmmv1beta1.ModuleConfig{KernelVersion: "6.1.0-k", ContainerImage: "r/i:t", Modprobe: mp}
}

func TestLoadArgs(t *testing.T) {
	cases := []struct {
		name string
		mp   kmmv1beta1.ModprobeSpec
		o    ArgvOptions
		want string
	}{
		{"plain", kmmv1beta1.ModprobeSpec{ModuleName: "m"}, ArgvOptions{Root: "/c/opt"}, "-v -d /c/opt m"},
		{"args and parameters", kmmv1beta1.ModprobeSpec{ModuleName: "m", Args: &kmmv1beta1.ModprobeArgs{Load: []string{"--first-time", "-b"}}, Parameters: []string{"a=1", "b=x y"}},
			ArgvOptions{Root: "/r"}, "-v -d /r --first-time -b m a=1 b=x y"},
		{"softdep", kmmv1beta1.ModprobeSpec{ModuleName: "m", ModulesLoadingOrder: []string{"m", "n"}}, ArgvOptions{Root: "/r", SoftdepFile: "/t/softdep.conf"},
			"-v -d /r -C /t/softdep.conf m"},
		{"dry run", kmmv1beta1.ModprobeSpec{ModuleName: "m", Parameters: []string{"p=1"}}, ArgvOptions{Root: "/r", DryRun: true}, "-n -S 6.1.0-k -v -d /r m p=1"},
		{"raw args replace the fields, with the image's -d", kmmv1beta1.ModprobeSpec{ModuleName: "m", Parameters: []string{"p=1"}, Args: &kmmv1beta1.ModprobeArgs{Load: []string{"-q"}},
			RawArgs: &kmmv1beta1.ModprobeArgs{Load: []string{"-vd", "/opt", "raw", "x=1"}}}, ArgvOptions{Root: "/c/opt"}, "-v --verbose -d /c/opt -- raw x=1"},
		{"raw args in dry run", kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: []string{"raw"}}}, ArgvOptions{Root: "/r", DryRun: true}, "-n -S 6.1.0-k -v -d /r -- raw"},
		{"raw unload only: load uses the fields", kmmv1beta1.ModprobeSpec{ModuleName: "m", RawArgs: &kmmv1beta1.ModprobeArgs{Unload: []string{"-r", "x"}}}, ArgvOptions{Root: "/r"}, "-v -d /r m"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadArgs(mcWith(tc.mp), tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("LoadArgs = %q, want %q", s, tc.want)
			}
		})
	}
}

func TestUnloadArgs(t *testing.T) {
	cases := []struct {
		name string
		mp   kmmv1beta1.ModprobeSpec
		o    ArgvOptions
		want string
	}{
		{"plain", kmmv1beta1.ModprobeSpec{ModuleName: "m", Parameters: []string{"ignored=1"}}, ArgvOptions{Root: "/r"}, "-r -v -d /r m"},
		{"args", kmmv1beta1.ModprobeSpec{ModuleName: "m", Args: &kmmv1beta1.ModprobeArgs{Unload: []string{"-w", "1000"}}}, ArgvOptions{Root: "/r"}, "-r -v -d /r -w 1000 m"},
		{"loading order removes all, in order", kmmv1beta1.ModprobeSpec{ModuleName: "a", ModulesLoadingOrder: []string{"a", "b", "c"}}, ArgvOptions{Root: "/r"}, "-r -v -d /r a b c"},
		{"dry run", kmmv1beta1.ModprobeSpec{ModuleName: "m"}, ArgvOptions{Root: "/r", DryRun: true}, "-n -S 6.1.0-k -r -v -d /r m"},
		{"raw", kmmv1beta1.ModprobeSpec{ModuleName: "m", RawArgs: &kmmv1beta1.ModprobeArgs{Unload: []string{"-rv", "m"}}}, ArgvOptions{Root: "/r"}, "--remove --verbose -d /r -- m"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := UnloadArgs(mcWith(tc.mp), tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.Join(got, " "); s != tc.want {
				t.Errorf("UnloadArgs = %q, want %q", s, tc.want)
			}
		})
	}
}

func TestArgsWithoutModuleName(t *testing.T) {
	mc := mcWith(kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: []string{"x"}}})
	if _, err := UnloadArgs(mc, ArgvOptions{Root: "/r"}); err == nil || !strings.Contains(err.Error(), "nothing to unload") {
		t.Errorf("UnloadArgs error = %v, want nothing to unload", err)
	}
	mc.Modprobe.RawArgs = &kmmv1beta1.ModprobeArgs{Unload: []string{"x"}}
	if _, err := LoadArgs(mc, ArgvOptions{Root: "/r"}); err == nil || !strings.Contains(err.Error(), "nothing to load") {
		t.Errorf("LoadArgs error = %v, want nothing to load", err)
	}
}

func TestInTreeRemoveArgs(t *testing.T) {
	if got := InTreeRemoveArgs("ice", "6.1.0-k", false); !slices.Equal(got, []string{"-r", "-v", "ice"}) {
		t.Errorf("got %q", got)
	}
	if got := InTreeRemoveArgs("ice", "6.1.0-k", true); !slices.Equal(got, []string{"-n", "-S", "6.1.0-k", "-r", "-v", "ice"}) {
		t.Errorf("dry run: got %q", got)
	}
}

func TestSoftdepConfig(t *testing.T) {
	cases := map[string]struct {
		order []string
		want  string
	}{
		"none":  {nil, ""},
		"one":   {[]string{"a"}, ""},
		"two":   {[]string{"a", "b"}, "softdep a pre: b\n"},
		"chain": {[]string{"a", "b", "c"}, "softdep a pre: b\nsoftdep b pre: c\n"},
	}
	for name, tc := range cases {
		if got := SoftdepConfig(tc.order); got != tc.want {
			t.Errorf("%s: SoftdepConfig(%q) = %q, want %q", name, tc.order, got, tc.want)
		}
	}
}

func TestClassifyModprobe(t *testing.T) {
	cases := []struct {
		stderr string
		want   contract.Reason
		absent bool
	}{
		{"modprobe: FATAL: Module kmm_x not found in directory /c/opt/lib/modules/6.1.0-k\n", contract.ReasonNotFound, true},
		{"modprobe: FATAL: Module ice is in use.\n", contract.ReasonBusy, false},
		{"modprobe: ERROR: could not insert 'x': Device or resource busy\n", contract.ReasonBusy, false},
		{"modprobe: ERROR: could not insert 'x': Exec format error\n", contract.ReasonOther, false},
		{"modprobe: FATAL: Module ice is not in kernel.\n", contract.ReasonOther, true},
		{"modprobe: FATAL: Module ice is builtin.\n", contract.ReasonOther, false},
		{"", contract.ReasonOther, false},
	}
	for _, tc := range cases {
		if got := classifyModprobe(tc.stderr); got != tc.want {
			t.Errorf("classifyModprobe(%q) = %s, want %s", tc.stderr, got, tc.want)
		}
		if got := notLoaded(tc.stderr); got != tc.absent {
			t.Errorf("notLoaded(%q) = %v, want %v", tc.stderr, got, tc.absent)
		}
	}
}
