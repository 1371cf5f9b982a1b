package worker

import (
	"path/filepath"
	"strings"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
	"github.com/kmm-project/kmm/contract"
)

// TestConfigPaths checks where the worker looks for a config's modules and firmware (the decoding
// of the config itself is tested in package contract).
func TestConfigPaths(t *testing.T) {
	mc := kmmv1beta1.ModuleConfig{KernelVersion: "6.1.0-k", Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "a", DirName: "/opt", FirmwarePath: "/firmware"}}
	cfg := contract.Config{Namespace: "ns", Name: "m", Config: mc, SetFirmwareClassPath: true}
	if firmwareDir(mc) != "firmware" || kernelDir(mc) != "opt/lib/modules/6.1.0-k" || firmwareHostPath(cfg) != contract.DefaultFirmwareHostPath {
		t.Errorf("firmwareDir %q, kernelDir %q, firmware host path %q", firmwareDir(mc), kernelDir(mc), firmwareHostPath(cfg))
	}
	mc.Modprobe.DirName, mc.Modprobe.FirmwarePath, cfg.FirmwareHostPath = "", "", "lib/../fw"
	if firmwareDir(mc) != "" || kernelDir(mc) != "opt/lib/modules/6.1.0-k" || firmwareHostPath(cfg) != "/fw" {
		t.Errorf("defaults: firmwareDir %q, kernelDir %q, firmware host path %q", firmwareDir(mc), kernelDir(mc), firmwareHostPath(cfg))
	}
}

func TestParseKeychain(t *testing.T) {
	cases := map[string]string{
		"dockerconfigjson": `{"auths":{"https://reg.example:5000/v1/":{"auth":"dXNlcjpwYXNz"}}}`,
		"dockercfg":        `{"reg.example:5000":{"username":"user","password":"pass"}}`,
	}
	for name, in := range cases {
		kc, err := ParseKeychain([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		auth, err := kc.Resolve(mustRegistry(t, "reg.example:5000"))
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := auth.Authorization()
		if err != nil || cfg.Username != "user" || cfg.Password != "pass" {
			t.Errorf("%s: credentials %+v, %v", name, cfg, err)
		}
		other, _ := kc.Resolve(mustRegistry(t, "other.example"))
		if cfg, _ := other.Authorization(); cfg.Username != "" {
			t.Errorf("%s: another registry got credentials %+v", name, cfg)
		}
	}
	if _, err := ParseKeychain([]byte(`{"auths":`)); err == nil || !strings.Contains(err.Error(), "malformed pull secret") {
		t.Errorf("malformed secret: %v", err)
	}
	if _, err := ReadKeychain(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "reading the pull secret") {
		t.Errorf("missing secret: %v", err)
	}
}

func TestRegistryHost(t *testing.T) {
	for in, want := range map[string]string{
		"https://index.docker.io/v1/": "index.docker.io", "docker.io": "index.docker.io", "quay.io": "quay.io",
		"http://reg:5000": "reg:5000", "reg:5000/path": "reg:5000",
	} {
		if got := registryHost(in); got != want {
			t.Errorf("registryHost(%q) = %q, want %q", in, got, want)
		}
	}
}
