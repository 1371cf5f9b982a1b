// Package kernelview is what the e2e-kernel guest's observer reports of its kernel (test/e2e/guest)
// and how it reads it: the host test and the guest init share these types. Everything here is read
// from the kernel's own files (/proc/modules, /sys/module, /proc/sys/kernel/random/boot_id,
// /dev/kmsg), never from kmm.
package kernelview

import (
	"strconv"
	"strings"
)

// Paths of the observer's HTTP API.
const (
	// PathState answers GET with a State; the query names the modules (module=<name>, repeated).
	PathState = "/state"
	// PathKmsg answers GET with the kernel log so far, one message a line.
	PathKmsg = "/kmsg"
	// PathLog answers GET /log/<name> with the guest's /var/log/<name>.log (containerd, kubelet).
	PathLog = "/log/"
	// PathReboot reboots the guest (reboot(2)) on POST.
	PathReboot = "/reboot"
	// PathPowerOff powers the guest off on POST.
	PathPowerOff = "/poweroff"
)

// State is the guest kernel's view at one moment.
type State struct {
	// Release is uname -r.
	Release string `json:"release"`
	// BootID is /proc/sys/kernel/random/boot_id.
	BootID string `json:"bootID"`
	// FirmwareClassPath is /sys/module/firmware_class/parameters/path.
	FirmwareClassPath string `json:"firmwareClassPath"`
	// Modules are the modules asked for, by name.
	Modules map[string]Module `json:"modules"`
}

// Module is one module as the kernel shows it.
type Module struct {
	// Loaded says whether /proc/modules lists it.
	Loaded bool `json:"loaded"`
	// State, RefCount and Holders are its /proc/modules fields (Live, Loading, Unloading).
	State    string   `json:"state,omitempty"`
	RefCount int      `json:"refCount,omitempty"`
	Holders  []string `json:"holders,omitempty"`
	// SysModule says whether /sys/module/<name> exists.
	SysModule bool `json:"sysModule"`
	// Version is /sys/module/<name>/version ("" when absent).
	Version string `json:"version,omitempty"`
	// Parameters are the files of /sys/module/<name>/parameters.
	Parameters map[string]string `json:"parameters,omitempty"`
}

// ParseProcModules reads /proc/modules ("name size refcount holders, state address") into
// Modules with Loaded, State, RefCount and Holders set, by name.
func ParseProcModules(data string) map[string]Module {
	out := map[string]Module{}
	for line := range strings.SplitSeq(data, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		m := Module{Loaded: true, State: f[4]}
		m.RefCount, _ = strconv.Atoi(f[2])
		for h := range strings.SplitSeq(strings.TrimSuffix(f[3], ","), ",") {
			if h != "" && h != "-" {
				m.Holders = append(m.Holders, h)
			}
		}
		out[f[0]] = m
	}
	return out
}

// KmsgText is the message of a /dev/kmsg record ("prio,seq,usec,flags;message"); continuation
// lines (starting with a space) are dropped.
func KmsgText(record string) (string, bool) {
	if strings.HasPrefix(record, " ") {
		return "", false
	}
	_, msg, ok := strings.Cut(record, ";")
	return strings.TrimRight(msg, "\n"), ok
}
