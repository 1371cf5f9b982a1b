//go:build linux

// Command guest is the init (PID 1) of the e2e-kernel test's qemu guest (test/e2e, docs/e2e.md):
// a Debian kernel booted from an initramfs that holds containerd, runc, the CNI plugins, kmod,
// busybox and the kubelet. It mounts the kernel file systems, loads the modules the node needs
// (virtio network, bridge, veth) and the in-tree module a Module removes later, configures qemu's
// user network, starts containerd and the kubelet with the configuration the host wrote into the
// initramfs, and serves two things on the guest's network:
//
//   - a TCP forwarder from the guest's own addresses to the host (10.0.2.2) for the registry's
//     port: pods reach the registry at the node IP, as on the host node, and containerd at
//     127.0.0.1, the address in the image references of kmm's install;
//   - the observer (ObserverPort, forwarded by qemu to the host's loopback): the test reads the
//     kernel's own view through it (/proc/modules, /sys/module, the kernel log) and asks for a
//     reboot. It never loads or unloads anything: that is the worker pods' job.
//
// It refuses to run unless it is PID 1.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// configFile is the Config the host writes into the initramfs.
const configFile = "/etc/kmm-guest/config.json"

// Config is what the host tells the guest.
type Config struct {
	// NodeName is the hostname and the node's name.
	NodeName string `json:"nodeName"`
	// GuestIP and HostIP are qemu's user network: the guest's address and the host's loopback.
	GuestIP string `json:"guestIP"`
	HostIP  string `json:"hostIP"`
	// BootModules are loaded with modprobe at boot, in order.
	BootModules []string `json:"bootModules"`
	// ForwardPorts are forwarded from 127.0.0.1 and GuestIP of the guest to HostIP.
	ForwardPorts []int `json:"forwardPorts"`
	// ObserverPort is the observer's port on GuestIP.
	ObserverPort int `json:"observerPort"`
	// Containerd and Kubelet are the daemons' arguments.
	Containerd []string `json:"containerd"`
	Kubelet    []string `json:"kubelet"`
}

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "guest: refusing to run: not PID 1 (this is the init of the e2e-kernel qemu guest)")
		os.Exit(2)
	}
	say("FATAL %v", run()) // run returns only on failure
	// PID 1 must not exit: power off, so that qemu ends.
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

// say prints a line on the serial console.
func say(format string, args ...any) {
	fmt.Printf("KMM-GUEST "+format+"\n", args...)
}

func run() error {
	if err := mountAll(); err != nil {
		return err
	}
	_ = os.Setenv("PATH", "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	var cfg Config
	data, err := os.ReadFile(configFile)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return err
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	say("kernel %s", unix.ByteSliceToString(uts.Release[:]))
	if out, err := exec.Command("modprobe", append([]string{"-a"}, cfg.BootModules...)...).CombinedOutput(); err != nil { //nolint:gosec // G204: the boot modules the host configured
		return fmt.Errorf("modprobe -a %v: %w: %s", cfg.BootModules, err, out)
	}
	if err := network(cfg); err != nil {
		return err
	}
	for _, p := range cfg.ForwardPorts {
		for _, ip := range []string{"127.0.0.1", cfg.GuestIP} {
			if err := forward(fmt.Sprintf("%s:%d", ip, p), fmt.Sprintf("%s:%d", cfg.HostIP, p)); err != nil {
				return err
			}
		}
	}
	go serveObserver(fmt.Sprintf("%s:%d", cfg.GuestIP, cfg.ObserverPort))
	// From here on every child is reaped here (the runc shims are re-parented to PID 1).
	go reap()
	if err := start("containerd", cfg.Containerd); err != nil {
		return err
	}
	if err := waitFile(socketOf(cfg.Containerd), 60*time.Second); err != nil {
		return err
	}
	if err := start("kubelet", cfg.Kubelet); err != nil {
		return err
	}
	say("READY")
	select {}
}

// mountAll mounts what containerd, runc and the kubelet need: proc, sysfs, devtmpfs, devpts,
// tmpfs on /run, /tmp and /dev/shm, and the cgroup2 hierarchy with its controllers enabled.
func mountAll() error {
	for _, m := range []struct{ src, dst, fs, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", ""},
		{"devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666"},
		{"tmpfs", "/dev/shm", "tmpfs", ""},
		{"tmpfs", "/run", "tmpfs", ""},
		{"tmpfs", "/tmp", "tmpfs", ""},
		// The kubelet's cAdvisor finds no file system for the initramfs ("rootfs"): the kubelet's
		// and containerd's state live on a tmpfs.
		{"tmpfs", "/var", "tmpfs", ""},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", ""},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil { //nolint:gosec // G301: the VM's mount points
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, 0, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fs, m.dst, err)
		}
	}
	for _, d := range []string{"/var/lib", "/var/log"} {
		if err := os.MkdirAll(d, 0o755); err != nil { //nolint:gosec // G301: the VM's /var
			return err
		}
	}
	return os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+cpuset +cpu +io +memory +pids"), 0o644) //nolint:gosec // G306: a cgroup control file
}

// network sets the hostname and qemu's user network: the guest address on eth0, the host as the
// default gateway.
func network(cfg Config) error {
	if err := unix.Sethostname([]byte(cfg.NodeName)); err != nil {
		return err
	}
	// The kubelet reports the machine ID (and logs an error without one); a new one per boot.
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return err
	}
	if err := os.WriteFile("/etc/machine-id", []byte(strings.ReplaceAll(strings.TrimSpace(string(bootID)), "-", "")+"\n"), 0o444); err != nil { //nolint:gosec // G306: world-readable, as on any machine
		return err
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "set", "eth0", "up"},
		{"addr", "add", cfg.GuestIP + "/24", "dev", "eth0"},
		{"route", "add", "default", "via", cfg.HostIP},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil { //nolint:gosec // G204: our own ip arguments
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// start starts a daemon, its output in /var/log/<name>.log.
func start(name string, args []string) error {
	if err := os.MkdirAll("/var/log", 0o755); err != nil { //nolint:gosec // G301: the VM's /var/log
		return err
	}
	log, err := os.Create("/var/log/" + name + ".log")
	if err != nil {
		return err
	}
	cmd := exec.Command(name, args...) //nolint:gosec // G204: the daemons the host configured
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	say("started %s (pid %d)", name, cmd.Process.Pid)
	return nil
}

// socketOf is the value of containerd's --address flag.
func socketOf(args []string) string {
	for i, a := range args {
		if a == "--address" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return "/run/containerd/containerd.sock"
}

func waitFile(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", path, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reap waits for every child, reporting the daemons that exit.
func reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.ECHILD {
			time.Sleep(time.Second)
			continue
		}
		if err == nil && ws.Exited() && ws.ExitStatus() != 0 {
			say("process %d exited with %d", pid, ws.ExitStatus())
		}
	}
}
