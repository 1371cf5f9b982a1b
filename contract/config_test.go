package contract

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	kmmv1beta1 "github.com/kmm-project/kmm/api/v1beta1"
)

const jsonConfig = `{"namespace":"ns","name":"m","setFirmwareClassPath":true,
 "config":{"kernelVersion":"6.1.0-k","containerImage":"reg/kmod:v1","imagePullPolicy":"Always",
  "registryTLS":{"insecureSkipTLSVerify":true},"inTreeModulesToRemove":["ice"],
  "modprobe":{"moduleName":"a","dirName":"/opt","parameters":["p=1"],"modulesLoadingOrder":["a","b"],"firmwarePath":"/firmware"}}}`

const yamlConfig = `namespace: ns
name: m
setFirmwareClassPath: true
config:
  kernelVersion: 6.1.0-k
  containerImage: reg/kmod:v1
  imagePullPolicy: Always
  registryTLS: {insecureSkipTLSVerify: true}
  inTreeModulesToRemove: [ice]
  modprobe:
    moduleName: a
    dirName: /opt
    parameters: ["p=1"]
    modulesLoadingOrder: [a, b]
    firmwarePath: /firmware
`

func TestParseConfigJSONAndYAML(t *testing.T) {
	for name, in := range map[string]string{"json": jsonConfig, "yaml": yamlConfig} {
		cfg, err := ParseConfig([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mc := cfg.Config
		if cfg.ModuleID() != "ns/m" || !cfg.SetFirmwareClassPath || mc.ImagePullPolicy != "Always" || !mc.RegistryTLS.InsecureSkipTLSVerify ||
			mc.Modprobe.ModulesLoadingOrder[1] != "b" || mc.InTreeModulesToRemove[0] != "ice" || mc.Modprobe.FirmwarePath != "/firmware" ||
			mc.Modprobe.DirName != "/opt" || mc.KernelVersion != "6.1.0-k" || cfg.FirmwareHostPath != "" {
			t.Errorf("%s: decoded %+v", name, cfg)
		}
	}
}

func TestParseConfigRejects(t *testing.T) {
	cases := map[string]struct{ in, want string }{
		"empty":             {"  \n", "the config is empty"},
		"not JSON":          {`{"namespace": "ns", `, "malformed config"},
		"wrong type":        {`{"namespace": {"a": 1}}`, "malformed config"},
		"unknown field":     {`{"namespace":"ns","name":"m","colour":"red","config":{}}`, `unknown field "colour"`},
		"missing image":     {`{"namespace":"ns","name":"m","config":{"kernelVersion":"k","modprobe":{"moduleName":"a"}}}`, "containerImage is required"},
		"missing kernel":    {`{"namespace":"ns","name":"m","config":{"containerImage":"i","modprobe":{"moduleName":"a"}}}`, "kernelVersion is required"},
		"missing module":    {`{"namespace":"ns","name":"m","config":{"kernelVersion":"k","containerImage":"i","modprobe":{}}}`, "moduleName is required"},
		"missing name":      {`{"config":{"kernelVersion":"k","containerImage":"i","modprobe":{"moduleName":"a"}}}`, "namespace and name"},
		"kernel with slash": {`{"namespace":"ns","name":"m","config":{"kernelVersion":"../../etc","containerImage":"i","modprobe":{"moduleName":"a"}}}`, "is not a kernel version"},
		"firmware root":     {`{"namespace":"ns","name":"m","config":{"kernelVersion":"k","containerImage":"i","modprobe":{"moduleName":"a","firmwarePath":"/"}}}`, "firmwarePath must be a directory"},
		"previous kernel":   {`{"namespace":"ns","name":"m","config":{"kernelVersion":"k","containerImage":"i","modprobe":{"moduleName":"a"}},"previous":{"kernelVersion":"k2","containerImage":"i","modprobe":{"moduleName":"a"}}}`, "the previous config is for kernel"},
		"previous invalid":  {`{"namespace":"ns","name":"m","config":{"kernelVersion":"k","containerImage":"i","modprobe":{"moduleName":"a"}},"previous":{"kernelVersion":"k","modprobe":{"moduleName":"a"}}}`, "previous config: "},
		"order":             {`{"namespace":"ns","name":"m","config":{"kernelVersion":"k","containerImage":"i","modprobe":{"moduleName":"a","modulesLoadingOrder":["b","a"]}}}`, "must equal moduleName"},
	}
	for name, tc := range cases {
		_, err := ParseConfig([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want it to contain %q", name, err, tc.want)
		}
	}
}

func TestReadConfig(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "config")
	if err := os.WriteFile(f, []byte(yamlConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadConfig(f); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadConfig(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "reading the config file") {
		t.Errorf("missing file: %v", err)
	}
	if err := os.WriteFile(f, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadConfig(f); err == nil || !strings.Contains(err.Error(), f) {
		t.Errorf("malformed file: error %v should name the file", err)
	}
}

func TestValidateForPairsPreviousWithReload(t *testing.T) {
	mc := kmmv1beta1.ModuleConfig{KernelVersion: "k", ContainerImage: "i:2", Modprobe: kmmv1beta1.ModprobeSpec{ModuleName: "a"}}
	old := mc
	old.ContainerImage = "i:1"
	with := Config{Namespace: "ns", Name: "m", Config: mc, Previous: &old}
	without := Config{Namespace: "ns", Name: "m", Config: mc}
	cases := []struct {
		action Action
		cfg    Config
		ok     bool
	}{
		{ActionReload, with, true}, {ActionReload, without, false},
		{ActionLoad, with, false}, {ActionUnload, with, false}, {ActionLoad, without, true},
	}
	for _, tc := range cases {
		if err := tc.cfg.ValidateFor(tc.action); (err == nil) != tc.ok {
			t.Errorf("%s with previous %v: error %v, want ok %v", tc.action, tc.cfg.Previous != nil, err, tc.ok)
		}
	}
}
