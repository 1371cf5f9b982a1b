// Command guestinit is the /init of the VM that test/vm boots: it mounts /proc, /sys and /dev,
// brings up the loopback interface, serves the kmod images of the initramfs's OCI layout from an
// in-process registry on 127.0.0.1, runs the project's real worker binary step by step against the
// running kernel, prints the protocol lines of package vm on the console and powers the VM off.
//
// It must be built with CGO_ENABLED=0 (nothing else is in the initramfs to run it) and refuses to
// run unless it is PID 1, so that it cannot load or unload modules on a developer's machine.
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "guestinit: refusing to run: this is the init of a test VM and must be PID 1")
		os.Exit(2)
	}
	r := &reporter{out: os.Stdout}
	// Start on a line of our own: the console may hold terminal escapes without a newline.
	_, _ = os.Stdout.WriteString("\n")
	func() {
		defer func() {
			if p := recover(); p != nil {
				r.check("init", "no-panic", false, "panic: %v\n%s", p, debug.Stack())
			}
		}()
		run(r)
	}()
	r.done()
	powerOff()
}

// run prepares the guest and runs every step.
func run(r *reporter) {
	start := time.Now()
	g, err := setUp(r)
	if !r.check("init", "setup", err == nil, "%v", err) {
		return
	}
	r.info("guest ready in %s: kernel %s, boot ID %s", time.Since(start).Round(time.Millisecond), g.plan.Kernel, g.bootID)
	for _, s := range steps() {
		t := time.Now()
		s.run(g)
		r.info("step %s took %s", s.name, time.Since(t).Round(time.Millisecond))
	}
}

// powerOff flushes the file systems and turns the VM off; qemu (with -no-reboot) then exits.
func powerOff() {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Fprintln(os.Stderr, "guestinit: power off:", err)
	}
	// PID 1 must not exit: the kernel would panic. Wait for the power-off to happen.
	select {}
}
