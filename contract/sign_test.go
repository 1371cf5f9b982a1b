package contract

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSignResult: a sign result parses with its own reasons; those reasons stay out of the
// worker pods' results.
func TestSignResult(t *testing.T) {
	for _, r := range []Result{
		{Action: ActionSign, Namespace: "ns", Name: "m", Kernel: "6.1.0", Outcome: OutcomeSucceeded, ImageDigest: "sha256:" + strings.Repeat("a", 64)},
		{Action: ActionSign, Namespace: "ns", Name: "m", Outcome: OutcomeFailed, Reason: ReasonSignKey, Message: "mismatch"},
		{Action: ActionSign, Namespace: "ns", Name: "m", Outcome: OutcomeFailed, Reason: ReasonSignInput},
		{Action: ActionSign, Namespace: "ns", Name: "m", Outcome: OutcomeFailed, Reason: ReasonImagePush},
		{Action: ActionSign, Namespace: "ns", Name: "m", Outcome: OutcomeFailed, Reason: ReasonImagePull},
	} {
		data, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ParseResult(data); err != nil || got != r {
			t.Errorf("%s: got %+v, %v", data, got, err)
		}
	}
	bad := Result{Action: ActionLoad, Namespace: "ns", Name: "m", Outcome: OutcomeFailed, Reason: ReasonSignKey}
	data, _ := bad.Marshal()
	if _, err := ParseResult(data); err == nil {
		t.Error("a load result with reason SignKey parsed")
	}
}

func TestReadSignConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		f := filepath.Join(dir, "c")
		if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	good := `{"namespace":"ns","name":"m","kernel":"6.1.0","unsignedImage":"r/a:u","image":"r/a:s","filesToSign":["/opt/lib/modules/6.1.0/*.ko"],"registryTLS":{"insecure":true}}`
	c, err := ReadSignConfig(write(good))
	if err != nil || !c.RegistryTLS.Insecure || c.FilesToSign[0] != "/opt/lib/modules/6.1.0/*.ko" {
		t.Fatalf("%+v %v", c, err)
	}
	for name, s := range map[string]string{
		"empty":         " ",
		"unknown field": strings.Replace(good, `"kernel"`, `"kernal"`, 1),
		"no files":      strings.Replace(good, `["/opt/lib/modules/6.1.0/*.ko"]`, `[]`, 1),
		"same image":    strings.Replace(good, `"r/a:s"`, `"r/a:u"`, 1),
		"no name":       strings.Replace(good, `"name":"m",`, ``, 1),
	} {
		if _, err := ReadSignConfig(write(s)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
