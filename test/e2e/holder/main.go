// Command holder opens the file its argument names (a module's device, /dev/<name>) and keeps it
// open until SIGTERM: while it runs, the module is in use and cannot be unloaded. It reports
// "holding <path>" in its termination message file, or why it could not open it. The e2e-kernel
// test runs it as a privileged pod on the qemu guest node.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: holder <file>")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		_ = os.WriteFile("/dev/termination-log", []byte(err.Error()), 0o600)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("holding", os.Args[1])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	_ = f.Close()
}
