//go:build vm

package vm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kmm-project/kmm/sign"
)

// signWant is what the kernel must answer for each module of SignSteps.
var signWant = map[string]struct {
	errno, log string
}{
	// Enforced: refused for lack of a signature...
	"unsigned": {"EKEYREJECTED", "Loading of unsigned module is rejected"},
	// ...and kmm's signature parsed, its digest algorithm supported, refused for the key alone
	// (not EBADMSG, not "unsigned", not "unsupported crypto").
	"fresh-key": {"EKEYREJECTED", "Loading of module with unavailable key is rejected"},
	// The control: the seeded fault of a little-endian sig_len is malformed to the kernel.
	"sig-len-little-endian": {"EBADMSG", ""},
	// Debian's signature is accepted with enforcement on.
	"distro-signed": {"", ""},
}

// TestSignatureInKernel boots the Debian kernel with module.sig_enforce=1 and checks that it reads
// kmm's module signature: a dummy.ko signed by package sign with a fresh key is refused for an
// unavailable key, not as unsigned or malformed, while the same module unsigned is refused as
// unsigned and Debian's signed one loads.
func TestSignatureInKernel(t *testing.T) {
	repo := repoRoot(t)
	cache := filepath.Join(repo, "bin", "vm-cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	qemu := requireQemu(t)
	k := fetchKernel(t, cache)
	root := filepath.Join(t.TempDir(), "root")
	buildStatic(t, repo, map[string]string{"./test/vm/signinit": filepath.Join(root, "init")})
	for step, data := range signModules(t, k) {
		writeFile(t, filepath.Join(root, SignModulesDir, step+".ko"), data, 0o644)
	}
	initrd := filepath.Join(cache, "sign-initrd.cpio")
	writeInitramfs(t, root, initrd)
	out := bootEnforcing(t, qemu, k, initrd, filepath.Join(cache, "sign-serial.log"))
	s := parseSerial(out)
	t.Logf("serial console protocol lines:\n%s", strings.Join(s.lines, "\n"))
	if s.done == "" {
		t.Fatalf("the guest printed no DONE line; last console output:\n%s", lastLines(out, 40))
	}
	for _, step := range SignSteps {
		var res SignResult
		if err := json.Unmarshal([]byte(s.results[step]), &res); err != nil {
			t.Errorf("%s: no result (%v): %q", step, err, s.results[step])
			continue
		}
		want := signWant[step]
		if res.Errno != want.errno || !strings.Contains(res.KernelLog, want.log) {
			t.Errorf("%s: errno %q, kernel log %q; want errno %q and a log with %q", step, res.Errno, res.KernelLog, want.errno, want.log)
		}
	}
}

// signModules makes the modules of SignSteps from the kernel's own dummy.ko.
func signModules(t *testing.T, k kernel) map[string][]byte {
	t.Helper()
	distro, err := os.ReadFile(filepath.Join(k.ModulesDir, "kernel/drivers/net/dummy.ko"))
	if err != nil {
		t.Fatal(err)
	}
	unsigned, _, signed, err := sign.Split(distro)
	if err != nil || !signed {
		t.Fatalf("Debian's dummy.ko is not signed as expected: signed %v, %v", signed, err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "kmm test VM key, not in any keyring"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sign.NewSigner(key, cert, sign.Options{Hash: crypto.SHA256})
	if err != nil {
		t.Fatal(err)
	}
	fresh, resigned, err := s.SignModule(distro)
	if err != nil || !resigned {
		t.Fatalf("signing dummy.ko: resigned %v, %v", resigned, err)
	}
	le := bytes.Clone(fresh)
	at := len(le) - len(sign.Magic) - 4
	binary.LittleEndian.PutUint32(le[at:], binary.BigEndian.Uint32(fresh[at:]))
	return map[string][]byte{"unsigned": unsigned, "fresh-key": fresh, "sig-len-little-endian": le, "distro-signed": distro}
}

// bootEnforcing boots like bootVM, with module.sig_enforce=1 on the kernel command line.
func bootEnforcing(t *testing.T, qemu string, k kernel, initrd, logFile string) string {
	t.Helper()
	args := qemuArgs(k, initrd)
	for i := range args {
		if i > 0 && args[i-1] == "-append" {
			args[i] += " module.sig_enforce=1"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	t.Logf("booting: %s %s", qemu, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, qemu, args...) // #nosec G204 -- fixed argv
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	t.Logf("qemu ran for %s (%v); serial console log: %s", time.Since(start).Round(time.Millisecond), err, logFile)
	if werr := os.WriteFile(logFile, out.Bytes(), 0o644); werr != nil {
		t.Error(werr)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("the VM did not power off within %s; last console output:\n%s", bootTimeout, lastLines(out.String(), 40))
	}
	return out.String()
}
