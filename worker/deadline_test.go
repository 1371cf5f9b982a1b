package worker

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kmm-project/kmm/contract"
)

// stall blocks until the client gives up on the request.
func stall(r *http.Request) { <-r.Context().Done() }

// TestDeadlineBoundsAStalledRegistry: a registry that never answers the manifest, or stops in the
// middle of a layer, makes the run fail after the timeout with an ImagePull result that says so.
func TestDeadlineBoundsAStalledRegistry(t *testing.T) {
	cases := map[string]func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool{
		"manifest never answered": func(_ http.ResponseWriter, r *http.Request, _ http.Handler) bool {
			if !strings.Contains(r.URL.Path, "/manifests/") {
				return false
			}
			stall(r)
			return true
		},
		"blob stalls mid-body": func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool {
			if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
				return false
			}
			body := innerBody(inner, r)
			if len(body) < 1000 { // the config: answer it
				serveChunked(w, body)
				return true
			}
			serveChunked(w, body[:len(body)/2])
			stall(r)
			return true
		},
	}
	for name, intercept := range cases {
		t.Run(name, func(t *testing.T) {
			var armed atomic.Bool // not while pushing
			reg := newTestRegistry(t, registryOpts{intercept: func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool {
				return armed.Load() && intercept(w, r, inner)
			}})
			ref, _ := reg.push(t, "kmod/stall:v1", image(t, kmodEntries(t, "opt")))
			armed.Store(true)
			s, m := newSandbox(t), newRecorder(t)
			w := newTestWorker(t, s, m, func(o *Options) { o.Timeout = time.Second })
			start := time.Now()
			res := w.Run(context.Background(), contract.ActionLoad, testConfig(ref))
			elapsed := time.Since(start)
			t.Logf("after %v: %s", elapsed, res.Message)
			if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonImagePull || !strings.Contains(res.Message, "timed out after 1s") {
				t.Errorf("got %s %s %q, want ImagePull saying it timed out after 1s", res.Outcome, res.Reason, res.Message)
			}
			if elapsed > 10*time.Second {
				t.Errorf("the run took %v with a timeout of 1s", elapsed)
			}
			assertNothingLoaded(t, s, m)
		})
	}
}

// TestDeadlineDuringModprobe: a modprobe that hangs is killed at the deadline, and the result is
// Other, saying so.
func TestDeadlineDuringModprobe(t *testing.T) {
	reg := newTestRegistry(t, registryOpts{})
	ref, _ := reg.push(t, "kmod/test:v1", image(t, kmodEntries(t, "opt")))
	hang := ModprobeFunc(func(ctx context.Context, args []string) ([]byte, []byte, error) {
		if strings.Contains(strings.Join(args, " "), "--show-depends") {
			return nil, nil, nil
		}
		<-ctx.Done()
		return nil, nil, errors.New("signal: killed")
	})
	w := newTestWorker(t, newSandbox(t), hang, func(o *Options) { o.Timeout = time.Second })
	res := w.Run(context.Background(), contract.ActionLoad, testConfig(ref))
	t.Logf("message: %s", res.Message)
	if res.Outcome != contract.OutcomeFailed || res.Reason != contract.ReasonOther || !strings.Contains(res.Message, "timed out after 1s") {
		t.Errorf("got %s %s %q, want Other saying it timed out after 1s", res.Outcome, res.Reason, res.Message)
	}
}

func TestDeadlineError(t *testing.T) {
	base := &Error{Reason: contract.ReasonOther, Err: errors.New("layer 0 is not a valid tar archive: context deadline exceeded")}
	cases := map[string]struct {
		err, ctxErr error
		reason      contract.Reason
		want        contract.Reason
		wantMsg     string
	}{
		"no error":               {nil, context.DeadlineExceeded, contract.ReasonImagePull, "", ""},
		"deadline during pull":   {base, context.DeadlineExceeded, contract.ReasonImagePull, contract.ReasonImagePull, "timed out after 2m0s while pulling: layer 0"},
		"deadline during load":   {base, context.DeadlineExceeded, contract.ReasonOther, contract.ReasonOther, "timed out after 2m0s while pulling: layer 0"},
		"cancelled, no deadline": {base, context.Canceled, contract.ReasonImagePull, contract.ReasonOther, "layer 0 is not"},
		"still running":          {base, nil, contract.ReasonImagePull, contract.ReasonOther, "layer 0 is not"},
	}
	for name, tc := range cases {
		err := deadlineError(tc.err, tc.ctxErr, 2*time.Minute, tc.reason, "pulling")
		if tc.err == nil {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if ReasonOf(err) != tc.want || !strings.HasPrefix(err.Error(), tc.wantMsg) {
			t.Errorf("%s: got %s %q, want %s starting %q", name, ReasonOf(err), err, tc.want, tc.wantMsg)
		}
	}
}

func TestRegistryTransportHasTimeouts(t *testing.T) {
	tr := registryTransport()
	if tr.TLSHandshakeTimeout == 0 || tr.ResponseHeaderTimeout == 0 || tr.DialContext == nil {
		t.Errorf("transport without timeouts: handshake %v, response header %v", tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout)
	}
}
