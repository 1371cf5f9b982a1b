//go:build vm

package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// bootTimeout bounds one VM run. A boot to the last check takes about 5-10 s on an idle 2-core
// machine under TCG; two busy host cores triple that.
const bootTimeout = 180 * time.Second

// qemuPackage is the Debian package of qemuBinary.
const (
	qemuPackage = "qemu-system-x86"
	qemuBinary  = "qemu-system-x86_64"
)

// requireQemu returns qemu's path, failing with the package to install when it is missing.
func requireQemu(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath(qemuBinary)
	if err != nil {
		t.Fatalf("%s is missing: install the Debian package %s (apt-get install --no-install-recommends %s; make test-vm does)",
			qemuBinary, qemuPackage, qemuPackage)
	}
	return p
}

// qemuArgs are qemu's arguments: QemuAccel and QemuCPUs, no network device, the serial console
// on standard output, and a kernel that powers off (panic=-1 with -no-reboot) instead of hanging when the init dies.
func qemuArgs(k kernel, initrd string) []string {
	return []string{
		"-accel", QemuAccel, "-smp", strconv.Itoa(QemuCPUs), "-m", "512", "-nographic", "-no-reboot", "-nic", "none",
		"-kernel", k.Vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet",
	}
}

// bootVM runs the VM to its end and returns the serial console output, also written to logFile.
// qemu's exit status says nothing about the checks (a panicking init also ends with status 0):
// the caller decides from the protocol lines.
func bootVM(t *testing.T, qemu string, k kernel, initrd, logFile string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	args := qemuArgs(k, initrd)
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

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// serial is what the guest reported on its console.
type serial struct {
	// lines are the protocol lines, without \r.
	lines []string
	// results maps a step to the worker's JSON result.
	results map[string]string
	// checks maps "<step>/<name>" to PASS or FAIL (FAIL when any line of the check failed).
	checks map[string]string
	// failed are the CHECK lines that did not pass.
	failed []string
	// done is the text of the DONE line, "" when there was none.
	done string
}

// terminalControl matches the terminal escape sequences the firmware and kernel write to the
// console (e.g. "ESC c ESC[?7l ESC[2J" just before the init's first line).
var terminalControl = regexp.MustCompile(`\x1b(\[[0-9;?]*[ -/]*[@-~]|[@-Z\\-_]|c)`)

// parseSerial reads the protocol lines of the console output: lines that start with Prefix.
func parseSerial(out string) serial {
	s := serial{results: map[string]string{}, checks: map[string]string{}}
	for line := range strings.SplitSeq(out, "\n") {
		line = terminalControl.ReplaceAllString(strings.TrimRight(line, "\r"), "")
		rest, ok := strings.CutPrefix(line, Prefix)
		if !ok {
			continue
		}
		s.lines = append(s.lines, line)
		kind, rest, _ := strings.Cut(rest, " ")
		switch kind {
		case KindResult:
			step, data, _ := strings.Cut(rest, " ")
			s.results[step] = data
		case KindCheck:
			f := strings.Fields(rest)
			if len(f) < 2 || f[1] != Pass {
				s.failed = append(s.failed, line)
			}
			if len(f) >= 2 && s.checks[f[0]] != Fail {
				s.checks[f[0]] = f[1]
			}
		case KindDone:
			s.done = rest
		}
	}
	return s
}

// TestParseSerial checks the console parser on its own: escapes and carriage returns around the
// protocol lines, kernel noise in between, a repeated check that failed once.
func TestParseSerial(t *testing.T) {
	out := "SeaBIOS\r\n\x1bc\x1b[?7l\x1b[2JKMM-VM CHECK init/setup PASS <nil>\r\n" +
		"[    5.1] dummy: disagrees about version of symbol module_layout\r\n" +
		"not a KMM-VM CHECK x/y PASS line\r\n" +
		"KMM-VM RESULT load {\"action\":\"load\"}\r\n" +
		"KMM-VM CHECK load/loaded FAIL dummy=absent\r\n" +
		"KMM-VM CHECK load/loaded PASS dummy=live\r\n" +
		"KMM-VM DONE 2 passed, 1 failed\r\n"
	s := parseSerial(out)
	if s.checks["init/setup"] != Pass || s.checks["load/loaded"] != Fail || s.checks["x/y"] != "" {
		t.Errorf("checks %v", s.checks)
	}
	if len(s.failed) != 1 || s.results["load"] != `{"action":"load"}` || s.done != "2 passed, 1 failed" {
		t.Errorf("failed %q results %v done %q", s.failed, s.results, s.done)
	}
}
