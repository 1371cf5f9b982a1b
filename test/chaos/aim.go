package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Aim is a fault aimed at a moment of the scenario instead of a random point: the seeded-bug runs
// (bugs_test.go) put the one fault that exposes a bug where the bug is, so that each is caught on
// every run rather than when random timing happens to hit it. A request matches when it is sent in
// Phase ("" for any) by any replica and its method, URL path, query and body contain the given
// strings (empty: any).
type Aim struct {
	Kind                      string
	Phase                     string
	Method, Path, Query, Body string
	// Count is how many matching requests get the fault (default 1).
	Count int
	// For, when set, keeps the fault on every matching request for this long after the first.
	For time.Duration
	// Hold is, for delay, how long the answer of a forwarded request is held back; for watch-cut,
	// how long the replica's pod watches are refused with 410 Gone after its streams were cut (the
	// answer of an API server that no longer has the resourceVersion a cut watch resumes from); for
	// the restarts, how long the process stays down before it starts again (at least).
	Hold time.Duration
	// Into, for the restarts, kills the process before the request is forwarded instead of after
	// it is done: the request runs into the outage (a kube-apiserver that is down: the proxy cannot
	// connect and answers 502 as a gateway does; the request never reached a server).
	Into bool
}

func (a Aim) String() string {
	return fmt.Sprintf("%s on %s %s?%s body~%q in phase %q", a.Kind, a.Method, a.Path, a.Query, a.Body, a.Phase)
}

// aimer applies the run's aims to the requests of every proxy.
type aimer struct {
	h     *harness
	mu    sync.Mutex
	aims  []Aim
	fired []int       // requests faulted, by aim
	first []time.Time // first faulted request, by aim
	// refuse is, by proxy, until when its pod watches and lists are refused (watch-cut aims).
	refuse map[*proxy]time.Time
	// restarting counts the aimed restarts not ready yet; ended is when the last one was.
	restarting int
	ended      time.Time
}

// settledFor says whether every aim has fired and nothing aimed has happened for d: every For and
// Hold over and every aimed restart ready (Options.AimSettle).
func (a *aimer) settledFor(d time.Duration) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.restarting > 0 {
		return false
	}
	last := a.ended
	for i, aim := range a.aims {
		if a.fired[i] == 0 {
			return false
		}
		if end := a.first[i].Add(aim.For + aim.Hold); end.After(last) {
			last = end
		}
	}
	return time.Since(last) >= d
}

func newAimer(h *harness, aims []Aim) *aimer {
	return &aimer{h: h, aims: aims, fired: make([]int, len(aims)), first: make([]time.Time, len(aims)), refuse: map[*proxy]time.Time{}}
}

// serve applies the aim r matches, if any, and says whether it answered r.
func (a *aimer) serve(p *proxy, w http.ResponseWriter, r *http.Request) bool {
	if a.refused(p, w, r) {
		return true
	}
	if isLease(r) || isWatch(r) {
		return false
	}
	body, err := peekBody(r)
	if err != nil {
		return false
	}
	i := a.match(r, body)
	if i < 0 {
		return false
	}
	aim := a.aims[i]
	a.h.sayf("aimed %s at %s's %s %s", aim.Kind, p.replica, r.Method, r.URL.Path)
	if a.apply(aim, p, w, r) {
		a.h.faulted(aim.Kind) // the restarts, kills and partitions count themselves when done
	}
	return true
}

// apply injects aim's fault into r and says whether the caller counts it.
func (a *aimer) apply(aim Aim, p *proxy, w http.ResponseWriter, r *http.Request) bool {
	switch aim.Kind {
	case FaultThrottle, FaultServerError, FaultConflict:
		writeStatus(w, map[string]int{FaultThrottle: http.StatusTooManyRequests, FaultServerError: http.StatusInternalServerError,
			FaultConflict: http.StatusConflict}[aim.Kind])
	case FaultDelay:
		a.holdAnswer(p, w, r, aim.Hold)
	case FaultWatchCut:
		a.mu.Lock()
		a.refuse[p] = time.Now().Add(aim.Hold)
		a.mu.Unlock()
		p.cutWatches()
		p.forward(w, r)
	case FaultKill:
		// The request is done and answered; the replica dies right after.
		p.forward(w, r)
		for _, rep := range a.h.replicas {
			if rep.name == p.replica && rep.kill() {
				a.h.faulted(FaultKill)
			}
		}
		return false
	case FaultPartition:
		// The leader is cut off from here until the other replica holds the Lease.
		go a.h.partitionLeader(context.WithoutCancel(r.Context()))
		dropConnection(w)
		return false
	default:
		a.restartAround(aim, p, w, r)
		return false
	}
	return true
}

// restartAround forwards r, restarts kube-apiserver or etcd once r is done, and relays r's answer
// only once the process is dead: the replica's next requests meet the outage (kube-apiserver) or
// wait in kube-apiserver for etcd. With aim.Into the process is killed first and r forwarded into
// the outage.
func (a *aimer) restartAround(aim Aim, p *proxy, w http.ResponseWriter, r *http.Request) {
	kind := aim.Kind
	name := map[string]string{FaultAPIServerRestart: "kube-apiserver", FaultEtcdRestart: "etcd"}[kind]
	if name == "" {
		p.forward(w, r)
		return
	}
	if aim.Into {
		a.restart(r.Context(), name, kind, aim.Hold)
		p.forward(w, r)
		return
	}
	rec := httptest.NewRecorder()
	p.forward(rec, r)
	a.restart(r.Context(), name, kind, aim.Hold)
	relay(w, rec)
}

// match finds the aim r is the next target of (-1 for none) and counts it.
func (a *aimer) match(r *http.Request, body []byte) int {
	phase := a.h.currentPhase()
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, aim := range a.aims {
		ok := (aim.Phase == "" || aim.Phase == phase) && (aim.Method == "" || aim.Method == r.Method) &&
			strings.Contains(r.URL.Path, aim.Path) && strings.Contains(r.URL.RawQuery, aim.Query) && bytes.Contains(body, []byte(aim.Body))
		if !ok {
			continue
		}
		switch {
		case aim.For > 0 && a.fired[i] > 0 && time.Since(a.first[i]) > aim.For:
			continue
		case aim.For == 0 && a.fired[i] >= max(aim.Count, 1):
			continue
		}
		if a.fired[i] == 0 {
			a.first[i] = time.Now()
		}
		a.fired[i]++
		return i
	}
	return -1
}

// refused answers the pod watches of a replica whose streams a watch-cut aim ended with 410 Gone
// while its refusal lasts, and holds its pod lists until then (so that the relist that follows
// sees what changed meanwhile, as a relist after a long disconnection does).
func (a *aimer) refused(p *proxy, w http.ResponseWriter, r *http.Request) bool {
	a.mu.Lock()
	until := a.refuse[p]
	a.mu.Unlock()
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/pods") || time.Now().After(until) {
		return false
	}
	if !isWatch(r) {
		select {
		case <-time.After(time.Until(until)):
		case <-r.Context().Done():
		}
		return false
	}
	st := metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: http.StatusGone,
		Reason: metav1.StatusReasonExpired, Message: "too old resource version (injected by the chaos proxy)"}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusGone)
	_ = json.NewEncoder(w).Encode(st)
	return true
}

// holdAnswer forwards r and holds its answer back for d (a slow API server: the request is done,
// its answer late).
func (a *aimer) holdAnswer(p *proxy, w http.ResponseWriter, r *http.Request, d time.Duration) {
	rec := httptest.NewRecorder()
	p.forward(rec, r.WithContext(context.WithoutCancel(r.Context())))
	select {
	case <-time.After(d):
	case <-r.Context().Done():
		return
	}
	relay(w, rec)
}

// restart kills a control-plane process now and starts it again in the background; it returns
// once the process is dead.
func (a *aimer) restart(ctx context.Context, name, kind string, down time.Duration) {
	h := a.h
	killed := make(chan struct{})
	a.mu.Lock()
	a.restarting++
	a.mu.Unlock()
	go func() {
		defer func() {
			a.mu.Lock()
			a.restarting--
			a.ended = time.Now()
			a.mu.Unlock()
		}()
		h.planeMu.Lock()
		defer h.planeMu.Unlock()
		p := h.plane[name]
		ready := etcdReady(p)
		if name == "kube-apiserver" {
			var err error
			if ready, err = apiserverReady(h.cfg); err != nil {
				close(killed)
				return
			}
		}
		d, err := p.restartAfter(context.WithoutCancel(ctx), down, func(ctx context.Context) error {
			select {
			case <-killed:
			default:
				close(killed) // the first readiness probe runs after the kill
			}
			return ready(ctx)
		})
		h.recordRestart(name, kind, d, err)
	}()
	<-killed
}

// peekBody reads a request's body (bounded) and puts it back.
func peekBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b, err
}

// relay writes a recorded answer.
func relay(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
