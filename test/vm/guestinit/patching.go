package main

import (
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// schedstatsKey is a sysctl whose every write switches a static key on or off, so that the kernel
// rewrites its own code at each of the key's sites in the scheduler: a path both CPUs run all the
// time.
const schedstatsKey = "/proc/sys/kernel/sched_schedstats"

// The bounds of stepPatching: how long it rewrites kernel code, and the fewest rewrites that count
// as having tried (about 30 a second under TCG on an idle 2-core host).
const (
	patchingFor    = 5 * time.Second
	minimumPatches = 20
)

// stepPatching has the kernel patch its own code while both CPUs run through the patched sites,
// which is what starting a kubelet does (its cgroups switch on socket accounting, a static key
// in every TCP send). Under multi-threaded TCG a CPU keeps running the int3 that a patch put in
// and took out again, and the guest locks up: the VM then never reaches the next step.
func stepPatching(g *guest) {
	const s = "patching"
	if !g.r.check(s, "two-cpus", runtime.NumCPU() >= 2, "%d CPUs online, want 2 (qemu -smp 2)", runtime.NumCPU()) {
		return
	}
	before := readTrim(schedstatsKey)
	if !g.r.check(s, "key", before == "0" || before == "1", "%s is %q", schedstatsKey, before) {
		return
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 * runtime.NumCPU() {
		wg.Add(1)
		go func() { defer wg.Done(); pingPong(stop) }()
	}
	patches, err := togglePatches(patchingFor)
	close(stop)
	wg.Wait()
	g.r.check(s, "patched", err == nil && patches >= minimumPatches,
		"%d rewrites of the kernel's code in %s, want at least %d (%v)", patches, patchingFor, minimumPatches, err)
	writeErr := writeSysctl(schedstatsKey, before)
	g.r.check(s, "restored", writeErr == nil && readTrim(schedstatsKey) == before,
		"%s is %q, was %q (%v)", schedstatsKey, readTrim(schedstatsKey), before, writeErr)
}

// togglePatches switches schedstatsKey on and off for d and returns how many times it did.
func togglePatches(d time.Duration) (int, error) {
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		if err := writeSysctl(schedstatsKey, strconv.Itoa(n%2)); err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeSysctl writes value to the sysctl file.
func writeSysctl(file, value string) error {
	fd, err := unix.Open(file, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	_, err = unix.Write(fd, []byte(value))
	return err
}

// pingPong bounces a byte over a socket pair until stop closes, so that the scheduler switches
// tasks (and runs the patched sites) on every CPU.
func pingPong(stop <-chan struct{}) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return
	}
	defer func() { _ = unix.Close(fds[0]) }()
	go func() {
		defer func() { _ = unix.Close(fds[1]) }()
		b := make([]byte, 1)
		for {
			if n, err := unix.Read(fds[1], b); err != nil || n == 0 {
				return
			}
			_, _ = unix.Write(fds[1], b)
		}
	}()
	b := []byte{1}
	for {
		select {
		case <-stop:
			return
		default:
		}
		if _, err := unix.Write(fds[0], b); err != nil {
			return
		}
		if _, err := unix.Read(fds[0], b); err != nil {
			return
		}
	}
}
