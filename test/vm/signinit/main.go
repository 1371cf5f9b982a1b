// Command signinit is the /init of test/vm's signature test (sign_test.go): booted with
// module.sig_enforce=1, it asks the kernel to load each module of vm.SignModulesDir with
// finit_module(2), in vm.SignSteps order, and prints for each a RESULT line with the errno and the
// kernel log lines the attempt added, then DONE, and powers the VM off.
//
// Built with CGO_ENABLED=0; it refuses to run unless it is PID 1, so that it never loads a module
// on a developer's machine.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kmm-project/kmm/test/vm"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "signinit: refusing to run: this is the init of a test VM and must be PID 1")
		os.Exit(2)
	}
	_, _ = os.Stdout.WriteString("\n")
	seen := len(kernelLog())
	for _, step := range vm.SignSteps {
		res := vm.SignResult{Errno: load(filepath.Join(vm.SignModulesDir, step+".ko"))}
		log := kernelLog()
		if len(log) >= seen {
			res.KernelLog = strings.TrimSpace(log[seen:])
		}
		seen = len(log)
		data, _ := json.Marshal(res)
		fmt.Printf("%s%s %s %s\n", vm.Prefix, vm.KindResult, step, data)
	}
	fmt.Printf("%s%s %d steps\n", vm.Prefix, vm.KindDone, len(vm.SignSteps))
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Fprintln(os.Stderr, "signinit: power off:", err)
	}
	select {} // PID 1 must not exit
}

// load asks the kernel to load the module file and returns the errno's name, "" on success.
func load(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return "open: " + err.Error()
	}
	defer f.Close() //nolint:errcheck // read-only
	err = unix.FinitModule(int(f.Fd()), "", 0)
	var errno syscall.Errno
	switch {
	case err == nil:
		return ""
	case errors.As(err, &errno):
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// kernelLog returns the kernel's log buffer.
func kernelLog() string {
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}
