package worker

import (
	"context"
	"errors"
	"strings"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// TestRawArgsAreChecked: a rawArgs argv gets the rules of a moduleName load. Options that make
// modprobe read another configuration, another module tree or a file of the node are refused
// however they are spelt (clustered, attached, abbreviated, after the module name); a module file
// is accepted only inside the image's module directory, and rewritten to the extracted file.
func TestRawArgsAreChecked(t *testing.T) {
	o := ArgvOptions{Root: "/cache/d/k/opt", ImageRoot: "/cache/d/k"}
	kd := "/opt/lib/modules/6.1.0-k"
	ok := []struct{ argv, want string }{
		{"m", "-v -d /cache/d/k/opt -- m"},
		{"-d /opt m p=1 q=a,b", "-v -d /cache/d/k/opt -- m p=1 q=a,b"},
		{"--dirname=/opt/ -a m n", "-v --all -d /cache/d/k/opt -- m n"},
		{"-vqS 6.1.0-k m", "-v --verbose --quiet -d /cache/d/k/opt -- m"},
		{"--first-time -i --force-vermagic m", "-v --first-time --ignore-install --force-vermagic -d /cache/d/k/opt -- m"},
		{kd + "/extra/m.ko", "-v -d /cache/d/k/opt -- /cache/d/k/opt/lib/modules/6.1.0-k/extra/m.ko"},
		{"-- -odd", "-v -d /cache/d/k/opt -- -odd"},
	}
	for _, tc := range ok {
		mc := mcWith(kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: strings.Fields(tc.argv), Unload: []string{"-r", "m"}}})
		got, err := LoadArgs(mc, o)
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("%q: got %q, %v; want %q", tc.argv, strings.Join(got, " "), err, tc.want)
		}
	}
	refused := []struct{ argv, want string }{
		{"-C /etc/evil.conf m", "install and remove commands would run as root"},
		{"m -C/etc/evil.conf", "configuration file"},
		{"-qC /etc/evil.conf m", "configuration file"},
		{"--conf=/etc/evil.conf m", "configuration file"},
		{"--config /etc/evil.conf m", "configuration file"},
		{"-d / m", "names a module tree other than the image's"},
		{"-d/host m", "module tree other than the image's"},
		{"--dirname=/opt/../etc m", "module tree other than the image's"},
		{"-d opt m", "module tree other than the image's"},
		{"-S 5.0.0 m", "names a kernel other than"},
		{"--dump-modversions /etc/shadow", "module file named on the command line"},
		{"--show-exports m", "module file named on the command line"},
		{"/lib/modules/6.1.0-k/kernel/x.ko", "outside the image's module directory"},
		{kd + "/../../../../etc/x.ko", "outside the image's module directory"},
		{"../../x.ko", "relative path"},
		{"-Z m", "not a modprobe option"},
		{"--re m", "ambiguous abbreviation"},
		{"--frobnicate m", "not a modprobe option"},
		{"-w abc m", "milliseconds"},
		{"-d", "needs a value"},
		{"-v", "names no module"},
	}
	for _, tc := range refused {
		mc := mcWith(kmmv1beta1.ModprobeSpec{RawArgs: &kmmv1beta1.ModprobeArgs{Load: strings.Fields(tc.argv), Unload: strings.Fields(tc.argv)}})
		for what, f := range map[string]func(kmmv1beta1.ModuleConfig, ArgvOptions) ([]string, error){"load": LoadArgs, "unload": UnloadArgs} {
			got, err := f(mc, o)
			var we *Error
			if err == nil || !errors.As(err, &we) || we.Reason != contract.ReasonInvalidConfig || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s %q: got %q, %v; want InvalidConfig saying %q", what, tc.argv, got, err, tc.want)
			}
		}
	}
}

// TestRawArgsLoadIsPathChecked: a rawArgs load runs the same --show-depends check as a
// moduleName load, so a crafted module index cannot make it insmod a file of the node; and a
// refused argv fails InvalidConfig before modprobe runs.
func TestRawArgsLoadIsPathChecked(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	good, _ := reg.push(t, "kmod/raw:v1", image(t, kmodEntries(t, "opt")))
	bad, _ := reg.push(t, "kmod/raw-escape:v1", image(t, tamperedModuleTree(t, map[string][2]string{"modules.dep.bin": {"extra/kmm_test_a.ko", "/etc/////////passwd"}})))
	raw := func(ref string, load ...string) contract.Config {
		cfg := testConfig(ref)
		cfg.Config.Modprobe = kmmv1beta1.ModprobeSpec{DirName: "/opt", RawArgs: &kmmv1beta1.ModprobeArgs{Load: load, Unload: []string{"-r", "kmm_test_a"}}}
		return cfg
	}

	s, m := newSandbox(t), newRecorder(t)
	mustSucceed(t, newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, raw(good, "-d", "/opt", "kmm_test_a")))
	if len(m.calls) != 2 || !strings.Contains(strings.Join(m.calls[0], " "), "--show-depends") || !strings.Contains(m.stdout.String(), "kmm_test_b.ko") {
		t.Errorf("a rawArgs load should be checked with --show-depends, then run: %q\n%s", m.calls, m.stdout.String())
	}

	s, m = newSandbox(t), newRecorder(t)
	res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, raw(bad, "kmm_test_a"))
	if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonOther || !strings.Contains(res.Message, "outside the module directory") {
		t.Errorf("tampered index with rawArgs: %s %s %q, want Other outside the module directory", res.Outcome, res.Reason, res.Message)
	}
	assertNothingLoaded(t, s, m)

	s, m = newSandbox(t), newRecorder(t)
	res = newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, raw(good, "-C", "/etc/modprobe.d/evil.conf", "kmm_test_a"))
	if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonInvalidConfig || !strings.Contains(res.Message, "configuration file") {
		t.Errorf("rawArgs with -C: %s %s %q, want InvalidConfig", res.Outcome, res.Reason, res.Message)
	}
	if len(m.calls) != 0 {
		t.Errorf("modprobe ran for a refused argv: %q", m.calls)
	}
}
