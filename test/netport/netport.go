// Package netport finds free TCP ports for the processes the test harnesses start (kube-controller-
// manager, kube-scheduler, extra kube-apiservers and etcd members, the operator's endpoints, the
// e2e kubelet). A port is free when it is asked for; nothing reserves it until its process listens.
package netport

import "net"

// Free returns a TCP port free on host (an IP address, such as 127.0.0.1).
func Free(host string) (int, error) {
	ports, err := FreeN(host, 1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreeN returns n distinct TCP ports free on host: it listens on all of them at once, then closes
// them.
func FreeN(host string, n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
