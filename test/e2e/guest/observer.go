//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kmm-project/kmm/test/e2e/kernelview"
)

// serveObserver answers the host test's questions about the kernel (kernelview).
func serveObserver(addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc(kernelview.PathState, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(state(r.URL.Query()["module"]))
	})
	mux.HandleFunc(kernelview.PathKmsg, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(kmsg()))
	})
	mux.HandleFunc(kernelview.PathLog, func(w http.ResponseWriter, r *http.Request) {
		name := filepath.Base(strings.TrimPrefix(r.URL.Path, kernelview.PathLog))
		http.ServeFile(w, r, "/var/log/"+name+".log")
	})
	for path, cmd := range map[string]int{kernelview.PathReboot: unix.LINUX_REBOOT_CMD_RESTART, kernelview.PathPowerOff: unix.LINUX_REBOOT_CMD_POWER_OFF} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				http.Error(w, "POST only", http.StatusMethodNotAllowed)
				return
			}
			w.WriteHeader(http.StatusAccepted)
			say("%s asked by the host", path)
			go func() {
				time.Sleep(200 * time.Millisecond) // let the answer go out
				unix.Sync()
				_ = unix.Reboot(cmd)
			}()
		})
	}
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	say("observer: %v", srv.ListenAndServe())
}

// state reads the kernel's view of the named modules.
func state(names []string) kernelview.State {
	s := kernelview.State{Release: readTrim("/proc/sys/kernel/osrelease"), BootID: readTrim("/proc/sys/kernel/random/boot_id"),
		FirmwareClassPath: readTrim("/sys/module/firmware_class/parameters/path"), Modules: map[string]kernelview.Module{}}
	procModules, _ := os.ReadFile("/proc/modules")
	loaded := kernelview.ParseProcModules(string(procModules))
	for _, n := range names {
		m := loaded[n]
		dir := filepath.Join("/sys/module", filepath.Base(n))
		if _, err := os.Stat(dir); err == nil {
			m.SysModule = true
		}
		m.Version = readTrim(filepath.Join(dir, "version"))
		params, _ := os.ReadDir(filepath.Join(dir, "parameters"))
		for _, p := range params {
			if m.Parameters == nil {
				m.Parameters = map[string]string{}
			}
			m.Parameters[p.Name()] = readTrim(filepath.Join(dir, "parameters", p.Name()))
		}
		s.Modules[n] = m
	}
	return s
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// kmsg returns every message of the kernel's log buffer, one a line (a fresh /dev/kmsg reader
// starts at the oldest record and reads one record per read until EAGAIN).
func kmsg() string {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err.Error()
	}
	defer unix.Close(fd) //nolint:errcheck // read only
	var b strings.Builder
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) { // overwritten records: go on with the next
			continue
		}
		if err != nil || n <= 0 {
			return b.String()
		}
		for rec := range strings.SplitSeq(string(buf[:n]), "\n") {
			if msg, ok := kernelview.KmsgText(rec); ok {
				b.WriteString(msg + "\n")
			}
		}
	}
}
