//go:build linux

package main

import (
	"io"
	"net"
)

// forward accepts connections on listen and copies each both ways to a connection to target.
func forward(listen, target string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				say("forwarder %s: %v", listen, err)
				return
			}
			go pipe(c, target)
		}
	}()
	return nil
}

func pipe(c net.Conn, target string) {
	defer c.Close() //nolint:errcheck // best effort
	t, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer t.Close() //nolint:errcheck // best effort
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(t, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, t); done <- struct{}{} }()
	<-done
}
