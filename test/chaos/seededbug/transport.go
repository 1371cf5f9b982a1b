package seededbug

import (
	"io"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/fields"
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
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(emptyPodList)),
		ContentLength: int64(len(emptyPodList)), Request: r}, nil
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
