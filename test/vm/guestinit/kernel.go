package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// loadedModules returns the modules of /proc/modules in its order: most recently loaded first.
func loadedModules() []string {
	data, err := os.ReadFile("/proc/modules")
	if err != nil {
		return nil
	}
	var mods []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			mods = append(mods, f[0])
		}
	}
	return mods
}

// moduleState says where the kernel shows mod: "live" when /proc/modules lists it and
// /sys/module/<mod>/initstate is live, "absent" when neither /proc/modules nor /sys/module has it,
// and anything else (a disagreement) as a description.
func moduleState(mod string) string {
	inProc := slices.Contains(loadedModules(), mod)
	initstate, err := os.ReadFile("/sys/module/" + mod + "/initstate")
	_, dirErr := os.Stat("/sys/module/" + mod)
	switch {
	case inProc && err == nil && strings.TrimSpace(string(initstate)) == "live":
		return "live"
	case !inProc && errors.Is(dirErr, fs.ErrNotExist):
		return "absent"
	default:
		return fmt.Sprintf("inconsistent: in /proc/modules %t, /sys/module/%s/initstate %q (%v)", inProc, mod, strings.TrimSpace(string(initstate)), err)
	}
}

// statesOf describes the state of each module, e.g. "dummy=live macvlan=absent".
func statesOf(mods ...string) string {
	parts := make([]string, 0, len(mods))
	for _, m := range mods {
		parts = append(parts, m+"="+moduleState(m))
	}
	return strings.Join(parts, " ")
}

// allIn reports whether every module is in state (live or absent).
func allIn(state string, mods ...string) bool {
	for _, m := range mods {
		if moduleState(m) != state {
			return false
		}
	}
	return true
}

// kernelLog returns the kernel's message buffer.
func kernelLog() string {
	buf := make([]byte, 1<<20)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// kernelLogLine returns the last line of the kernel log containing s, or "".
func kernelLogLine(s string) string {
	lines := strings.Split(kernelLog(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}

// readTrim returns the content of file without surrounding space, or the error as text.
func readTrim(file string) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(bytes.TrimSpace(data))
}

// exists reports whether file exists.
func exists(file string) bool {
	_, err := os.Stat(file)
	return err == nil
}
