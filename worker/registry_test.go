package worker

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kmm-project/kmm/contract"
)

func TestImagePullFailures(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()

	cases := map[string]struct{ image, want string }{
		"image that does not exist":      {reg.host + "/kmod/test:absent", "image not found"},
		"repository that does not exist": {reg.host + "/kmod/nothing:v1", "image not found"},
		"registry unreachable":           {closed + "/kmod/test:v1", "registry unreachable"},
		"invalid reference":              {"Not A Reference!", "invalid image reference"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newSandbox(t)
			m := newRecorder(t)
			res := newTestWorker(t, s, m).Run(context.Background(), contract.ActionLoad, testConfig(tc.image))
			t.Logf("message: %s", res.Message)
			if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, tc.want) {
				t.Errorf("got %s %q, want ImagePull saying %q", res.Reason, res.Message, tc.want)
			}
			if len(m.calls) != 0 || len(listFiles(t, s.cache)) != 0 {
				t.Errorf("a failed pull ran modprobe (%q) or wrote to the cache (%v)", m.calls, listFiles(t, s.cache))
			}
		})
	}
}

// writeDockerConfig writes a pull secret for host in .dockerconfigjson form.
func writeDockerConfig(t *testing.T, host, user, password string) string {
	t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	f := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(f, fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, host, auth), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestBasicAuthRegistry(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{user: "kmm", password: "s3cret"})
	ref, digest := reg.push(t, "kmod/private:v1", image(t, kmodEntries(t, "opt")))

	cases := map[string]struct {
		secret string
		ok     bool
	}{
		"no credentials":    {"", false},
		"wrong credentials": {writeDockerConfig(t, reg.host, "kmm", "wrong"), false},
		"other registry":    {writeDockerConfig(t, "elsewhere.example", "kmm", "s3cret"), false},
		"right credentials": {writeDockerConfig(t, reg.host, "kmm", "s3cret"), true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			kc, err := ReadKeychain(tc.secret)
			if err != nil {
				t.Fatal(err)
			}
			res := newTestWorker(t, newSandbox(t), newRecorder(t), func(o *Options) { o.Keychain = kc }).Run(context.Background(), contract.ActionLoad, testConfig(ref))
			if tc.ok {
				mustSucceed(t, res)
				if res.ImageDigest != digest.String() {
					t.Errorf("digest %s, want %s", res.ImageDigest, digest)
				}
				return
			}
			t.Logf("message: %s", res.Message)
			if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "authentication failed") {
				t.Errorf("got %s %q, want ImagePull with an authentication message", res.Reason, res.Message)
			}
		})
	}
}

func TestTLSRegistry(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{tls: true})
	ref, _ := reg.push(t, "kmod/tls:v1", image(t, kmodEntries(t, "opt")))

	cfg := testConfig(ref)
	res := newTestWorker(t, newSandbox(t), newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg)
	t.Logf("message: %s", res.Message)
	if res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "certificate") || !strings.Contains(res.Message, "insecureSkipTLSVerify") {
		t.Errorf("untrusted certificate: got %s %q, want ImagePull about the certificate", res.Reason, res.Message)
	}

	cfg.Config.RegistryTLS.InsecureSkipTLSVerify = true
	mustSucceed(t, newTestWorker(t, newSandbox(t), newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg))
}

func TestInsecurePlainHTTPRegistry(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	cfg := testConfig(ref)
	cfg.Config.RegistryTLS.Insecure = true
	mustSucceed(t, newTestWorker(t, newSandbox(t), newRecorder(t)).Run(context.Background(), contract.ActionLoad, cfg))
}
