package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kmm-project/kmm/contract"
)

// The host side effects of a cluster: everything outside the test folder that it changes. Start
// records the state before (record.json in the folder); Cleanup undoes it from that record, in
// Stop and in the cleanup command that `make e2e` runs from a shell trap (a test killed by
// `go test -timeout` runs no deferred function).

// sysctls are the kernel settings the kubelet (setupKernelTunables, unless protectKernelDefaults)
// and the CNI bridge plugin (ip_forward, as the pods' gateway) change; Cleanup restores them.
var sysctls = []string{
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
}

// hostPaths are created by the daemons or the pods whatever their flags say: the CNI result cache
// (libcni's default), the runc shims' sockets (/run/containerd/s), the device plugin socket
// directory (a constant of the kubelet), the container log links, and what kmm's worker pods mount
// (cache, firmware, and /lib/modules, which containerd creates as an empty directory for a hostPath
// volume whose path is missing, as on this host: a worker pod of a real node's shape run here shows
// as a changed host), and what kmm's DRA driver pods mount (/var/lib/kubelet/plugins and
// plugins_registry, /var/run/cdi, that is /run/cdi). Cleanup removes those that did not exist
// before Start.
var hostPaths = []string{
	"/var/lib/cni", "/run/containerd", "/var/lib/kubelet", "/var/log/containers", "/var/log/pods",
	"/opt/containerd", "/run/netns", "/var/lib/kmm", contract.DefaultFirmwareHostPath, "/lib/modules", "/run/cdi",
}

// daemonBinaries are the executables Cleanup may stop: only processes running one of them whose
// command line names the test folder (every daemon of the cluster takes a path inside it, and every
// runc shim the address of the cluster's containerd socket).
var daemonBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd", "containerd-shim-runc-v2", "qemu-system-x86_64"}

// record is what Start saw before changing the host, written to record.json in the test folder.
type record struct {
	// Sysctls holds each value of sysctls before Start.
	Sysctls map[string]string `json:"sysctls"`
	// Absent lists the hostPaths that did not exist.
	Absent []string `json:"absent"`
	// Links are the network links Start creates (the node's veth pair and the CNI bridge).
	Links []string `json:"links"`
	// Routes are the routes Start adds, as `ip route` arguments (type and prefix).
	Routes [][]string `json:"routes"`
}

const recordFile = "record.json"

// takeRecord reads the host's state before Start and writes it to dir/record.json.
func takeRecord(dir string, links []string, routes [][]string) (*record, error) {
	r := &record{Sysctls: map[string]string{}, Links: links, Routes: routes}
	for _, s := range sysctls {
		v, err := readSysctl(s)
		if err != nil {
			return nil, err
		}
		r.Sysctls[s] = v
	}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			r.Absent = append(r.Absent, p)
		}
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return r, os.WriteFile(filepath.Join(dir, recordFile), data, 0o600)
}

// withSbinPath appends /usr/sbin and /sbin to PATH when missing (a non-login shell's PATH may lack
// them): ip, iptables and runc live there, and the daemons inherit the PATH.
func withSbinPath() {
	path := os.Getenv("PATH")
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if !slices.Contains(filepath.SplitList(path), d) {
			path += string(filepath.ListSeparator) + d
		}
	}
	_ = os.Setenv("PATH", path)
}

func sysctlPath(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

func readSysctl(name string) (string, error) {
	data, err := os.ReadFile(sysctlPath(name))
	return strings.TrimSpace(string(data)), err
}

// Cleanup undoes what a cluster started in dir did to the host, whether Stop ran or the test
// died: it stops the cluster's processes that are still running and kills what runs in its pods,
// unmounts everything under dir, removes the /kubepods cgroups, the network links, any KUBE-*
// iptables chain, restores the sysctls and removes the host paths that were absent before. It
// keeps dir itself (the logs) and is a no-op on a folder without a record. It returns every step
// that failed.
func Cleanup(dir string) error {
	withSbinPath()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(dir, recordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("reading %s: %w", recordFile, err)
	}
	var errs []error
	errs = append(errs, killDaemons(dir), killPods())
	errs = append(errs, unmountUnder(dir), unmountUnder("/run/containerd"), unmountUnder("/var/lib/kubelet"), unmountUnder("/run/netns"))
	errs = append(errs, removeKubepods())
	for _, l := range r.Links {
		if _, err := os.Stat(filepath.Join("/sys/class/net", l)); err == nil {
			errs = append(errs, run("ip", "link", "del", l))
		}
	}
	for _, rt := range r.Routes {
		if out, err := runOut("ip", "route", "show", "exact", rt[len(rt)-1]); err == nil && strings.TrimSpace(out) != "" {
			errs = append(errs, run("ip", append([]string{"route", "del"}, rt...)...))
		}
	}
	errs = append(errs, removeKubeChains())
	for s, v := range r.Sysctls {
		if cur, err := readSysctl(s); err == nil && cur != v {
			errs = append(errs, os.WriteFile(sysctlPath(s), []byte(v), 0o600))
		}
	}
	for _, p := range r.Absent {
		errs = append(errs, os.RemoveAll(p))
	}
	errs = append(errs, os.Remove(filepath.Join(dir, recordFile)))
	return errors.Join(errs...)
}

// killDaemons sends SIGKILL to the cluster's daemons still running (see daemonBinaries) and waits
// for them to go.
func killDaemons(dir string) error {
	var pids []int
	for _, pid := range allPIDs() {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || !slices.Contains(daemonBinaries, filepath.Base(exe)) {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(dir+"/")) {
			continue
		}
		pids = append(pids, pid)
	}
	return killAndWait(pids)
}

// killPods sends SIGKILL to every process in the /kubepods cgroups (the pods' containers) until
// none is left.
func killPods() error {
	for range 50 {
		var pids []int
		_ = filepath.WalkDir("/sys/fs/cgroup/pids/kubepods", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil //nolint:nilerr // a cgroup removed while we walk
			}
			data, _ := os.ReadFile(p) //nolint:gosec // G122: cgroupfs, written by the kernel only
			for f := range strings.FieldsSeq(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("processes still running in /kubepods after 5 s of SIGKILL")
}

func allPIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killAndWait(pids []int) error {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for range 100 {
		alive := slices.DeleteFunc(slices.Clone(pids), func(pid int) bool { return syscall.Kill(pid, 0) != nil || isZombie(pid) })
		if len(alive) == 0 {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("processes %v still alive after SIGKILL", pids)
}

func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && i+2 < len(data) && data[i+2] == 'Z'
}

// mountsUnder returns the mount points at or below root, deepest first.
func mountsUnder(root string) []string {
	// The kernel lists mount points by their real path: a bin/ that is a symlink (a git worktree
	// sharing another checkout's bin/) must not hide them.
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == root || strings.HasPrefix(mp, root+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts
}

// unescapeMount undoes the octal escapes (\040 for a space) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder unmounts every mount at or below root (the pods' volumes, network namespaces,
// container root file systems and shm), lazily when busy.
func unmountUnder(root string) error {
	var errs []error
	for _, mp := range mountsUnder(root) {
		if err := syscall.Unmount(mp, 0); err != nil {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeKubepods removes the kubelet's /kubepods cgroup tree from every cgroup v1 hierarchy,
// deepest first (a cgroup directory is removed with rmdir once it has no process and no child).
func removeKubepods() error {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	var errs []error
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for range 20 { // a cgroup whose last process just died may be busy for a moment
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeKubeChains deletes the KUBE-* iptables chains (IPv4 and IPv6) and the rules that jump to
// them. The kubelet of the cluster is configured not to make any (makeIPTablesUtilChains: false);
// this catches a configuration that does.
func removeKubeChains() error {
	var errs []error
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool + "-save"); err != nil {
			continue
		}
		out, err := exec.Command(tool + "-save").Output() //nolint:gosec // G204: iptables-save or ip6tables-save
		if err != nil {
			errs = append(errs, fmt.Errorf("%s-save: %w", tool, err))
			continue
		}
		for table, rules := range kubeRules(string(out)) {
			for _, rule := range rules.jumps {
				errs = append(errs, run(tool, append([]string{"-t", table, "-D"}, rule...)...))
			}
			for _, c := range rules.chains {
				errs = append(errs, run(tool, "-t", table, "-F", c))
			}
			for _, c := range rules.chains {
				errs = append(errs, run(tool, "-t", table, "-X", c))
			}
		}
	}
	return errors.Join(errs...)
}

type tableRules struct {
	chains []string   // KUBE-* chains
	jumps  [][]string // rules of other chains that jump to one (as -D arguments)
}

// kubeRules parses iptables-save output into the KUBE-* chains and the jumps to them, per table.
func kubeRules(save string) map[string]*tableRules {
	res := map[string]*tableRules{}
	var table string
	for line := range strings.SplitSeq(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":KUBE-"):
			tr := res[table]
			if tr == nil {
				tr = &tableRules{}
				res[table] = tr
			}
			tr.chains = append(tr.chains, strings.Fields(line[1:])[0])
		case strings.HasPrefix(line, "-A ") && !strings.HasPrefix(line, "-A KUBE-") && strings.Contains(line, "-j KUBE-"):
			tr := res[table]
			if tr == nil {
				tr = &tableRules{}
				res[table] = tr
			}
			tr.jumps = append(tr.jumps, strings.Fields(line)[1:]) // the rules the kubelet writes have no quoted field
		}
	}
	return res
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput() //nolint:gosec // G204: ip and iptables with arguments we build
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// hostSnapshot is what an e2e run must leave as it found: sysctls, links, addresses, routes,
// iptables rules, the hostPaths, mounts, cgroups and the cluster's processes.
func hostSnapshot() map[string]string {
	s := map[string]string{}
	for _, name := range sysctls {
		s["sysctl "+name], _ = readSysctl(name)
	}
	for _, p := range hostPaths {
		_, err := os.Lstat(p)
		s["path "+p] = strconv.FormatBool(err == nil)
	}
	for _, c := range [][]string{{"ip", "-o", "link", "show"}, {"ip", "-o", "addr", "show"}, {"ip", "route", "show", "table", "all"}, {"iptables-save"}, {"ip6tables-save"}} {
		out, _ := exec.Command(c[0], c[1:]...).Output() //nolint:gosec // G204: fixed commands
		s[strings.Join(c, " ")] = stableLines(string(out))
	}
	s["mounts"] = strings.Join(mountsUnder("/"), "\n")
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	s["kubepods cgroups"] = strings.Join(roots, " ")
	return s
}

// stableLines drops what changes on its own in command output: iptables-save's comments and
// counters, link statistics, address lifetimes.
func stableLines(out string) string {
	var keep []string
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.Index(line, " ["); strings.HasPrefix(line, ":") && i > 0 {
			line = line[:i]
		}
		if i := strings.Index(line, "valid_lft"); i > 0 {
			line = line[:i]
		}
		keep = append(keep, strings.TrimSpace(line))
	}
	return strings.Join(keep, "\n")
}

// diffSnapshots names every entry that differs between before and after.
func diffSnapshots(before, after map[string]string) error {
	var errs []error
	keys := make([]string, 0, len(before))
	for k := range before {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if before[k] != after[k] {
			errs = append(errs, fmt.Errorf("host left changed: %s: was %q, now %q", k, before[k], after[k]))
		}
	}
	return errors.Join(errs...)
}
