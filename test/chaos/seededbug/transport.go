package seededbug

import (
	"io"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"

	"github.com/kmm-project/kmm/contract"
)

// failedListAsEmpty is ErrorAsNoPods's transport wrapper (rest.Config.Wrap).
func failedListAsEmpty(rt http.RoundTripper) http.RoundTripper { return emptyOnFailure{next: rt} }

// emptyOnFailure answers a failed list of one node's pods with an empty list.
type emptyOnFailure struct{ next http.RoundTripper }

// emptyPodList is the answer to a failed list.
const emptyPodList = `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}`

// RoundTrip sends r; a list of one node's pods that met an error, or an error answer, gets an
// empty list with 200 instead.
func (t emptyOnFailure) RoundTrip(r *http.Request) (*http.Response, error) {
	if !nodePodList(r) {
		return t.next.RoundTrip(r)
	}
	resp, err := t.next.RoundTrip(r)
	if err == nil && resp.StatusCode < http.StatusMultipleChoices {
		return resp, nil
	}
	if resp != nil {
		discard(resp)
	}
	return emptyList(r), nil
}

// nodePodList says whether r lists the pods of one node (not a watch).
func nodePodList(r *http.Request) bool {
	q := r.URL.Query()
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/pods") || q.Get("watch") == "true" {
		return false
	}
	sel, err := fields.ParseSelector(q.Get("fieldSelector"))
	if err != nil {
		return false
	}
	_, one := sel.RequiresExactMatch("spec.nodeName")
	return one
}

// throttledDevicePluginListAsEmpty is ThrottleSkipsDPCheck's transport wrapper: a live read of one
// node's device plugin pods answered 429 gets an empty list with 200 instead.
func throttledDevicePluginListAsEmpty(rt http.RoundTripper) http.RoundTripper {
	return dpListAsEmpty{next: rt, throttled: true}
}

// stalledDevicePluginListAsEmpty is StallAsNoDevicePlugin's transport wrapper: a live read of one
// node's device plugin pods not answered within stallLimit gets an empty list with 200 instead.
func stalledDevicePluginListAsEmpty(rt http.RoundTripper) http.RoundTripper {
	return dpListAsEmpty{next: rt, stall: stallLimit}
}

// stallLimit is how long StallAsNoDevicePlugin waits for the live read before taking it as "none".
const stallLimit = 300 * time.Millisecond

// dpListAsEmpty answers a live read of one node's device plugin pods with an empty list when it was
// throttled, or when it took longer than stall (0: no limit).
type dpListAsEmpty struct {
	next      http.RoundTripper
	throttled bool
	stall     time.Duration
}

// RoundTrip sends r; see dpListAsEmpty.
func (t dpListAsEmpty) RoundTrip(r *http.Request) (*http.Response, error) {
	if !nodePodList(r) || !strings.Contains(r.URL.Query().Get("labelSelector"), contract.LabelDevicePlugin) {
		return t.next.RoundTrip(r)
	}
	if t.stall == 0 {
		resp, err := t.next.RoundTrip(r)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			return resp, err
		}
		discard(resp)
		return emptyList(r), nil
	}
	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := t.next.RoundTrip(r)
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-time.After(t.stall):
		go func() {
			if a := <-done; a.resp != nil {
				discard(a.resp)
			}
		}()
		return emptyList(r), nil
	}
}

// discard reads and closes an answer no one will read.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
}

// emptyList is an empty pod list answered with 200 to r.
func emptyList(r *http.Request) *http.Response {
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(emptyPodList)),
		ContentLength: int64(len(emptyPodList)), Request: r}
}
