package validation

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

// TestRawArgsAdmission: admission refuses the rawArgs a worker would refuse whatever the kernel,
// with a message that says what is wrong and why.
func TestRawArgsAdmission(t *testing.T) {
	cases := []struct {
		load, unload string
		dirName      string
		want         string // "" when accepted
	}{
		{load: "-v kmm_a p=1", unload: "-rv kmm_a"},
		{load: "-d /opt kmm_a", unload: "-r kmm_a"},
		{load: "-d /kmm -a a b", unload: "-r -a a b", dirName: "/kmm"},
		{load: "/opt/lib/modules/6.1.0/extra/a.ko", unload: "-r a"},
		{load: "-S 6.1.0 a", unload: "-r a"},
		{load: "-C /etc/modprobe.d/x.conf a", unload: "-r a",
			want: `spec.moduleLoader.container.modprobe.rawArgs.load: Invalid value: ["-C","/etc/modprobe.d/x.conf","a"]: "--config" makes modprobe read a configuration file instead of the worker's: its install and remove commands would run as root on the node`},
		{load: "a", unload: "-r a --conf=/etc/x", want: `rawArgs.unload: Invalid value`},
		{load: "-d / a", unload: "-r a", want: `"--dirname /" names a module tree other than the image's modprobe.dirName /opt`},
		{load: "/etc/shadow", unload: "-r a", want: `"/etc/shadow" is outside the image's module directory /opt/lib/modules`},
		{load: "--dump-modversions /x", unload: "-r a", want: `module file named on the command line`},
		{load: "-q", unload: "-r a", want: `names no module`},
		{load: "--bogus a", unload: "-r a", want: `"--bogus" is not a modprobe option the worker knows`},
	}
	for _, tc := range cases {
		mp := &kmmv1beta1.ModprobeSpec{DirName: tc.dirName, RawArgs: &kmmv1beta1.ModprobeArgs{Load: strings.Fields(tc.load), Unload: strings.Fields(tc.unload)}}
		errs := validateModprobe(field.NewPath("spec", "moduleLoader", "container", "modprobe"), mp)
		got := errs.ToAggregate()
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%q / %q: refused: %v", tc.load, tc.unload, got)
		case tc.want != "" && (got == nil || !strings.Contains(got.Error(), tc.want)):
			t.Errorf("%q / %q: got %v, want an error saying %s", tc.load, tc.unload, got, tc.want)
		}
	}
}

// TestRawArgsModuleConfig: the config check that the operator makes before it creates a worker
// pod, and the worker again, also knows the kernel.
func TestRawArgsModuleConfig(t *testing.T) {
	c := &kmmv1beta1.ModuleConfig{KernelVersion: "6.1.0-k", ContainerImage: "r/i:t",
		Modprobe: kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: []string{"-S", "5.0.0", "a"}, Unload: []string{"-r", "/opt/lib/modules/5.0.0/a.ko"}}}}
	err := ModuleConfig(c)
	for _, want := range []string{
		`config.modprobe.rawArgs.load: "--set-version 5.0.0" names a kernel other than the one the worker loads for (6.1.0-k)`,
		`config.modprobe.rawArgs.unload: "/opt/lib/modules/5.0.0/a.ko" is outside the image's module directory /opt/lib/modules/6.1.0-k`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want it to say %s", err, want)
		}
	}
	c.Modprobe.RawArgs = &kmmv1beta1.ModprobeArgs{Load: []string{"-S", "6.1.0-k", "a"}, Unload: []string{"-r", "a"}}
	if err := ModuleConfig(c); err != nil {
		t.Errorf("a good rawArgs config was refused: %v", err)
	}
}
