package envtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Child is a direct child process of the test process: envtest starts etcd and kube-apiserver so.
type Child struct {
	PID  int
	Name string // the command name of /proc/<pid>/stat
}

// Children lists the direct children of this process, read from /proc (Linux only; nil when /proc
// cannot be read).
func Children() []Child {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := strconv.Itoa(os.Getpid())
	var out []Child
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		open, end := strings.Index(s, "("), strings.LastIndex(s, ")")
		if open < 0 || end < open {
			continue
		}
		if fields := strings.Fields(s[end+1:]); len(fields) >= 2 && fields[1] == self {
			out = append(out, Child{PID: pid, Name: s[open+1 : end]})
		}
	}
	return out
}
