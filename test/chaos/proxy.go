package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/kmm-project/kmm/internal/apipath"
)

// ProxyFaults are the shares of a replica's requests its proxy answers itself instead of the API
// server (429, 500, and 409 on updates), the share it delays and by how much at most. Lease
// requests are left alone (lease loss is what the partition fault is for), and so are the
// discovery reads. Watch requests are faulted as they open, as kube-apiserver's priority and
// fairness throttles a watch at its start: 429, 500 or a delay (client-go's informers list with a
// watch, so without these an informer's start would meet no request fault at all).
type ProxyFaults struct {
	Throttle, ServerError, Conflict, Delay float64
	MaxDelay                               time.Duration
}

// proxy stands between one operator replica and kube-apiserver: the replica's kubeconfig points at
// it (plain HTTP on 127.0.0.1), and it forwards as the administrator with the replica's own user
// agent. It injects the request faults, cuts watch streams and partitions the replica on the
// harness's command, and reports every write it forwards.
type proxy struct {
	replica string
	srv     *http.Server
	addr    string
	rp      *httputil.ReverseProxy
	leases  *leaseBook
	counts  *faultCounts
	// onWrite is told of every write the replica sends, before it is forwarded: all but the leader
	// election's own (the Lease, and the Events about it in its namespace, which a replica
	// records as it gains or loses the Lease).
	onWrite func(w sentWrite)

	mu          sync.Mutex
	rng         *rand.Rand
	faults      ProxyFaults
	partitioned bool
	seq         int
	inflight    map[int]inflightReq
	writes      map[string]int // successful writes by "VERB resource"
	// aims are the faults aimed at moments of the scenario (seeded-bug runs), nil otherwise.
	aims *aimer
}

// sentWrite is a write a replica sent, as its proxy forwards it: arrived is when it reached the proxy.
type sentWrite struct {
	replica, method, path string
	arrived               time.Time
}

// arrivedKey keys the time a request reached the proxy in its context.
type arrivedKey struct{}

type inflightReq struct {
	cancel context.CancelFunc
	watch  bool
}

// newProxy starts a proxy to the API server of cfg for replica.
func newProxy(cfg *rest.Config, replica string, seed uint64, leases *leaseBook, counts *faultCounts, onWrite func(sentWrite)) (*proxy, error) {
	target, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, err
	}
	p := &proxy{replica: replica, leases: leases, counts: counts, onWrite: onWrite, rng: rand.New(rand.NewPCG(seed, 0x9e3779b9)), //nolint:gosec // G404: seeded on purpose
		inflight: map[int]inflightReq{}, writes: map[string]int{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set("User-Agent", "kmm-chaos-"+replica)
		},
		Transport:      rt,
		ErrorLog:       log.New(io.Discard, "", 0), // cut streams and partitions are the point
		FlushInterval:  -1,
		ModifyResponse: p.observeResponse,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, err.Error())
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p.addr = l.Addr().String()
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

func (p *proxy) close() { _ = p.srv.Close() }

// setFaults changes the request fault shares.
func (p *proxy) setFaults(f ProxyFaults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = f
}

func isWatch(r *http.Request) bool {
	return r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true"
}

// The request classes of the request fault breakdown (Report.RequestFaults).
const (
	classWatch = "watch"
	classRead  = "read"
	classWrite = "write"
)

func requestClass(r *http.Request) string {
	switch {
	case isWatch(r):
		return classWatch
	case isWriteMethod(r.Method):
		return classWrite
	}
	return classRead
}

func isLease(r *http.Request) bool { return strings.Contains(r.URL.Path, "/leases") }

// isDiscovery says whether r asks for the API's discovery documents (/api, /apis/<group>/<version>,
// /version, /openapi): the manager reads them once at start and exits when that fails, so a fault
// there is one more restart, not a fault the operator's reconciles meet (docs/reliability.md).
func isDiscovery(r *http.Request) bool {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch parts[0] {
	case "api":
		return len(parts) <= 2
	case "apis":
		return len(parts) <= 3
	case "version", "openapi":
		return true
	}
	return false
}

func isWriteMethod(m string) bool {
	return m == http.MethodPost || m == http.MethodPut || m == http.MethodPatch || m == http.MethodDelete
}

// ServeHTTP forwards one request, or refuses it (partition), or answers it with an injected fault.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), arrivedKey{}, time.Now()))
	defer cancel()
	p.mu.Lock()
	if p.partitioned {
		p.mu.Unlock()
		dropConnection(w)
		return
	}
	p.seq++
	id := p.seq
	p.inflight[id] = inflightReq{cancel: cancel, watch: isWatch(r)}
	fault, delay := p.pickFault(r)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.inflight, id)
		p.mu.Unlock()
	}()
	r = r.WithContext(ctx)
	if p.aims != nil && p.aims.serve(p, w, r) {
		return // a fault aimed at this request (aim.go)
	}
	if fault != 0 {
		writeStatus(w, fault)
		return
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
	}
	p.forward(w, r)
}

// forward reports a write to the watcher and passes the request on to the API server.
func (p *proxy) forward(w http.ResponseWriter, r *http.Request) {
	if isWriteMethod(r.Method) && !isLease(r) && !strings.Contains(r.URL.Path, "/namespaces/"+LeaseNamespace+"/") && p.onWrite != nil {
		arrived, _ := r.Context().Value(arrivedKey{}).(time.Time)
		p.onWrite(sentWrite{replica: p.replica, method: r.Method, path: r.URL.Path, arrived: arrived})
	}
	p.rp.ServeHTTP(w, r)
}

// pickFault draws the fault of one request (p.mu held): an HTTP status to answer with, or a delay.
func (p *proxy) pickFault(r *http.Request) (int, time.Duration) {
	if isLease(r) || isDiscovery(r) {
		return 0, 0
	}
	f := p.faults
	x := p.rng.Float64()
	class := requestClass(r)
	switch {
	case x < f.Throttle:
		p.counts.addRequest(FaultThrottle, class)
		return http.StatusTooManyRequests, 0
	case x < f.Throttle+f.ServerError:
		p.counts.addRequest(FaultServerError, class)
		return http.StatusInternalServerError, 0
	case x < f.Throttle+f.ServerError+f.Conflict && (r.Method == http.MethodPut || r.Method == http.MethodPatch):
		p.counts.addRequest(FaultConflict, class)
		return http.StatusConflict, 0
	case p.rng.Float64() < f.Delay && f.MaxDelay > 0:
		p.counts.addRequest(FaultDelay, class)
		return 0, time.Duration(p.rng.Int64N(int64(f.MaxDelay))) + time.Millisecond
	}
	return 0, 0
}

// writeStatus answers with a Kubernetes Status of code, as the API server words it.
func writeStatus(w http.ResponseWriter, code int) {
	reasons := map[int]metav1.StatusReason{http.StatusTooManyRequests: metav1.StatusReasonTooManyRequests,
		http.StatusInternalServerError: metav1.StatusReasonInternalError, http.StatusConflict: metav1.StatusReasonConflict}
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Code: int32(code), Reason: reasons[code], Message: "injected by the chaos proxy"} //nolint:gosec // G115: an HTTP status
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

// dropConnection closes the client's connection without an answer, as a partition would.
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			_ = c.Close()
			return
		}
	}
	w.WriteHeader(http.StatusServiceUnavailable)
}

// observeResponse counts the successful writes and keeps the Lease holder from the Lease writes.
func (p *proxy) observeResponse(resp *http.Response) error {
	r := resp.Request
	if !isWriteMethod(r.Method) || resp.StatusCode >= 300 {
		return nil
	}
	if !isLease(r) {
		p.mu.Lock()
		p.writes[r.Method+" "+resourceOf(r.URL.Path)]++
		p.mu.Unlock()
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	obj, _, err := clientgoscheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if lease, ok := obj.(*coordinationv1.Lease); err == nil && ok && lease.Spec.HolderIdentity != nil {
		p.leases.wrote(p.replica, *lease.Spec.HolderIdentity)
	}
	return nil
}

// resourceOf names the resource of an API path for the write counts ("pods", "nodemodulesconfigs/status"),
// or the path itself when it names none.
func resourceOf(path string) string {
	p, ok := apipath.Parse(path)
	switch {
	case !ok:
		return path
	case p.Subresource != "":
		return p.Resource + "/" + p.Subresource
	}
	return p.Resource
}

// cutWatches ends every watch stream the replica has open and returns how many.
func (p *proxy) cutWatches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, x := range p.inflight {
		if x.watch {
			x.cancel()
			n++
		}
	}
	return n
}

// partition refuses every request of the replica from now on and ends those in flight.
func (p *proxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = true
	for _, x := range p.inflight {
		x.cancel()
	}
}

// heal ends the partition.
func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = false
}

// takeWrites returns the successful writes so far and starts counting again.
func (p *proxy) takeWrites() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.writes
	p.writes = map[string]int{}
	return w
}

// leaseBook knows which replica holds the Lease, from the Lease writes the proxies forwarded.
type leaseBook struct {
	mu       sync.Mutex
	identity map[string]string // replica → its leader election identity
	holder   string            // replica
	at       time.Time         // the holder's last Lease write
	since    time.Time         // when holder last changed
}

func newLeaseBook() *leaseBook { return &leaseBook{identity: map[string]string{}} }

// wrote records a successful Lease write of replica that left holder in the Lease.
func (b *leaseBook) wrote(replica, holder string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if holder == "" {
		if b.holder == replica {
			b.holder, b.since = "", time.Now() // released
		}
		return
	}
	b.identity[replica] = holder
	if b.holder != replica {
		b.since = time.Now()
	}
	b.holder, b.at = replica, time.Now()
}

// renewing is the replica holding the Lease if its last Lease write is younger than maxAge ("" if not).
func (b *leaseBook) renewing(maxAge time.Duration) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if time.Since(b.at) >= maxAge {
		return ""
	}
	return b.holder
}

// currentSince is the replica holding the Lease ("" when none) and since when.
func (b *leaseBook) currentSince() (string, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holder, b.since
}

// current is the replica holding the Lease ("" when none).
func (b *leaseBook) current() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.holder
}
