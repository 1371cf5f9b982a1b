package install_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kmm-project/kmm/test/envtest"
)

// The install tests run the operator as installed by config/default against a kube-apiserver that
// reaches the webhook the way a cluster does: through the webhook Service, resolved to the ready
// endpoints of its EndpointSlice (--enable-aggregator-routing: there is no kube-proxy here to make
// the ClusterIP work), and verified against the caBundle for kmm-webhook-service.kmm-system.svc.
//
// Endpoint addresses: the API server refuses loopback addresses in an EndpointSlice, and this
// machine may send test traffic to nothing but loopback. So each operator replica gets a "pod IP"
// from TEST-NET-1 (192.0.2.0/24, RFC 5737, never routed) and kube-apiserver's egress for the
// cluster network (--egress-selector-config-file) goes through egressProxy, an HTTP CONNECT proxy
// on a Unix socket that maps <pod IP>:<container port> to the loopback address the replica
// listens on. No packet is addressed to 192.0.2.x; a target the proxy does not know is refused.

var (
	env   *envtest.Env
	proxy *egressProxy
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kmm-install-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	proxy, err = startEgressProxy(filepath.Join(dir, "egress.sock"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer proxy.Close()
	egress := filepath.Join(dir, "egress.yaml")
	if err := os.WriteFile(egress, []byte(egressConfig(proxy.socket)), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err = envtest.StartWith(envtest.Options{Bare: true, APIServerFlags: map[string]string{
		"enable-aggregator-routing":   "true",
		"egress-selector-config-file": egress,
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	return m.Run()
}

func egressConfig(socket string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: ` + socket + "\n"
}

// egressProxy is kube-apiserver's way into the "cluster network": an HTTP CONNECT proxy that
// knows each replica's pod address and connects to its loopback listener instead.
type egressProxy struct {
	socket string
	ln     net.Listener

	mu     sync.Mutex
	routes map[string]string // pod IP:port -> loopback host:port
	conns  map[string]int    // connections per pod IP:port
}

func startEgressProxy(socket string) (*egressProxy, error) {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, err
	}
	p := &egressProxy{socket: socket, ln: ln, routes: map[string]string{}, conns: map[string]int{}}
	go p.serve()
	return p, nil
}

func (p *egressProxy) Close() { _ = p.ln.Close() }

// Route makes podAddr (e.g. 192.0.2.1:9443) lead to local (a loopback address).
func (p *egressProxy) Route(podAddr, local string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routes[podAddr] = local
}

// Conns returns how many connections the API server opened to podAddr.
func (p *egressProxy) Conns(podAddr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns[podAddr]
}

func (p *egressProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *egressProxy) handle(c net.Conn) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	p.mu.Lock()
	local, ok := p.routes[req.Host]
	p.conns[req.Host]++
	p.mu.Unlock()
	if !ok {
		_, _ = io.WriteString(c, "HTTP/1.1 502 No Route To "+req.Host+"\r\n\r\n")
		return
	}
	up, err := net.DialTimeout("tcp", local, 5*time.Second)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Cannot Reach "+local+"\r\n\r\n")
		return
	}
	defer func() { _ = up.Close() }()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}
