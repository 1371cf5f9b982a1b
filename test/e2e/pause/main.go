// Command pause is the pod sandbox ("pause") image of the e2e cluster: the first process of every
// pod, holding its namespaces. It waits for SIGTERM or SIGINT and reaps the children reparented to
// it (it is PID 1 of the pod when the pod shares its process namespace).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
