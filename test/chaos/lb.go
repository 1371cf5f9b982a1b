package chaos

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// balancer is the control plane's load balancer: a TCP proxy (TLS passes through) on the address
// every client dials (the first kube-apiserver's, which it took over), sending each new connection
// to the next kube-apiserver instance that answers /readyz, round robin. It polls every instance's
// /readyz; an instance the injector is about to kill is taken out first (down). When no instance
// is ready (etcd is restarting: every /readyz fails), it sends connections to the instances that
// are up, as a cloud load balancer fails open. Connections to a killed instance break with it.
type balancer struct {
	l        net.Listener
	backends []*backend
	hc       *http.Client
	done     chan struct{}

	mu   sync.Mutex
	next int
	// conns are the open client connections, to close them all at the end.
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// backend is one kube-apiserver instance behind the balancer.
type backend struct {
	addr string
	// up is false from just before the instance is killed until its restart answered /readyz.
	up bool
	// ready is the last /readyz poll's answer.
	ready bool
}

// lbWait bounds how long a new connection waits for an instance that is up.
const lbWait = 30 * time.Second

// newBalancer listens on addr (retrying while the port is still held by the process it replaces)
// and balances over the instances at addrs, all up.
func newBalancer(addr string, addrs []string, cfg *rest.Config) (*balancer, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	hc.Timeout = time.Second
	var l net.Listener
	for i := 0; ; i++ {
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if i == 100 {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
	b := &balancer{l: l, hc: hc, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	for _, a := range addrs {
		b.backends = append(b.backends, &backend{addr: a, up: true, ready: true})
	}
	b.wg.Add(1 + len(b.backends))
	go b.serve()
	for i := range b.backends {
		go b.poll(i)
	}
	return b, nil
}

// setUp marks instance i up or down.
func (b *balancer) setUp(i int, up bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends[i].up = up
	if !up {
		b.backends[i].ready = false
	}
}

// poll keeps instance i's ready bit from its /readyz.
func (b *balancer) poll(i int) {
	defer b.wg.Done()
	url := "https://" + b.backends[i].addr + "/readyz"
	for {
		select {
		case <-b.done:
			return
		case <-time.After(200 * time.Millisecond):
		}
		ok := false
		if resp, err := b.hc.Get(url); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			ok = resp.StatusCode == http.StatusOK
		}
		b.mu.Lock()
		b.backends[i].ready = ok && b.backends[i].up
		b.mu.Unlock()
	}
}

// pick chooses the instance for a new connection: the next ready one, else the next up one.
func (b *balancer) pick() (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.backends)
	for _, want := range []func(*backend) bool{func(x *backend) bool { return x.ready }, func(x *backend) bool { return x.up }} {
		for k := range n {
			x := b.backends[(b.next+k)%n]
			if want(x) {
				b.next = (b.next + k + 1) % n
				return x.addr, true
			}
		}
	}
	return "", false
}

func (b *balancer) serve() {
	defer b.wg.Done()
	for {
		c, err := b.l.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		go b.forward(c)
	}
}

// forward connects c to an instance and copies both ways until either side ends.
func (b *balancer) forward(c net.Conn) {
	defer func() {
		_ = c.Close()
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
	}()
	s, err := b.dial()
	if err != nil {
		return
	}
	defer func() { _ = s.Close() }()
	ended := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		ended <- struct{}{}
	}
	go cp(s, c)
	go cp(c, s)
	select {
	case <-ended:
	case <-b.done:
	}
}

// dial connects to an instance, waiting (up to lbWait) while none is up.
func (b *balancer) dial() (net.Conn, error) {
	deadline := time.Now().Add(lbWait)
	for time.Now().Before(deadline) {
		if addr, ok := b.pick(); ok {
			s, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				return s, nil
			}
		}
		select {
		case <-b.done:
			return nil, errors.New("balancer closed")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil, errors.New("no kube-apiserver instance up")
}

// close stops listening and ends every connection.
func (b *balancer) close() {
	close(b.done)
	_ = b.l.Close()
	b.mu.Lock()
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// readyAt is a /readyz check of the instance at addr with cfg's credentials.
func readyAt(cfg *rest.Config, addr string) (func(context.Context) error, error) {
	c := rest.CopyConfig(cfg)
	c.Host = "https://" + addr
	return apiserverReady(c)
}
